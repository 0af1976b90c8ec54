"""A failure recorded while its run is paused, in process: the pause holds what the
failure would do to the run (fail it, retry it, escalate it) until the client resumes
it, and the resume then does it. Before, the run's automatic retry started a new attempt
nobody resumed, an exhausted budget with `on_exhausted: escalate` failed the run instead
of escalating it, and the client's resume was refused (409) either way (`make chaos`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from common.invariants import violations
from runs import services
from runs.engine import control
from runs.models import EscalationTicket, Run
from runs.people import escalations
from runs.selectors import run_history
from runs.states import RunStatus
from tests.runs.engine.harness import EngineRun

Start = Callable[..., EngineRun]
QUICK = {"backoff": "fixed", "base_delay_ms": 0, "jitter": 0}


@pytest.fixture
def start(engine_run: Start) -> Start:
    return engine_run


def plan(*steps: dict[str, Any], **run: Any) -> dict[str, Any]:
    """One agent per step, side by side."""
    agents = [
        {"name": f"a{n}", "tasks": [{"name": "t", "steps": [s]}]} for n, s in enumerate(steps)
    ]
    return {"name": "paused", "agents": agents, **run}


def step(name: str, **retry: Any) -> dict[str, Any]:
    return {"name": name, "tool": "noop", "retry": {"max_attempts": 1, **QUICK, **retry}}


def pause(run: EngineRun) -> None:
    with run.committed():
        services.run_pause(run_id=run.run.pk)


def resume(run: EngineRun) -> Run:
    """The client's resume, then the worker's (the resume message)."""
    with run.committed():
        services.run_resume(run_id=run.run.pk)
    with run.committed():
        assert control.resume(run.run.pk)
    return run.refresh()


def test_a_run_failing_while_paused_stays_paused_and_fails_at_its_resume(start: Start) -> None:
    run = start(plan(step("boom"), step("slow")))
    attempt = run.claim("boom")
    pause(run)

    run.record("boom", attempt, run.failure("tool_error", "boom failed"))

    assert run.refresh().status == RunStatus.PAUSED
    assert run.step("slow").status == "paused"  # the other agent's: held with the run
    held = run_history(run.run).get(kind="error", message__startswith="the run fails at")
    assert held.payload["held"] is True
    assert resume(run).status == RunStatus.FAILED
    assert run.run.last_error["code"] == "tool_error"
    assert run.step("slow").status == "cancelled"
    assert violations() == {}


def test_a_run_that_retries_starts_its_next_attempt_only_when_resumed(start: Start) -> None:
    run = start(plan(step("boom"), failure_mode="retry", max_attempts=2))
    attempt = run.claim("boom")
    pause(run)

    run.record("boom", attempt, run.failure("tool_error"))

    assert (run.refresh().status, run.run.attempt_number) == (RunStatus.PAUSED, 1)
    assert resume(run).status == RunStatus.RETRYING
    assert (run.run.attempt_number, run.run.automatic_retries) == (2, 1)
    assert violations() == {}


def test_a_cancel_while_a_failure_is_held_cancels_the_run(start: Start) -> None:
    run = start(plan(step("boom"), failure_mode="retry", max_attempts=2))
    attempt = run.claim("boom")
    pause(run)
    run.record("boom", attempt, run.failure("tool_error"))

    with run.committed():
        services.run_cancel(run_id=run.run.pk, reason="no longer wanted")

    assert (run.refresh().status, run.run.attempt_number) == (RunStatus.CANCELLED, 1)
    assert violations() == {}


def test_a_last_attempt_failing_while_paused_escalates_at_the_resume(start: Start) -> None:
    run = start(plan(step("flaky", max_attempts=2, on_exhausted="escalate")))
    run.fail("flaky", "timeout", retryable=True)
    attempt = run.claim("flaky")
    pause(run)

    held = run.record("flaky", attempt, run.failure("timeout", retryable=True))

    # The ticket opens at once (people are told); the run stays the client's, paused.
    ticket = EscalationTicket.objects.get(run=run.run)
    assert (ticket.reason, ticket.status) == ("attempts_exhausted", "open")
    assert run.refresh().status == RunStatus.PAUSED
    assert held.status == "pending"  # held for people, not failed
    assert resume(run).status == RunStatus.ESCALATED
    with pytest.raises(AssertionError, match="could not be claimed"):
        run.finish("flaky")  # nothing starts before the resolution

    with run.committed():
        escalations.escalation_resolve(ticket_id=ticket.pk, action="resume", actor="on-call")
    run.finish("flaky")
    assert run.refresh().status == RunStatus.COMPLETED
    assert violations() == {}


def test_a_resume_with_nothing_held_carries_on(start: Start) -> None:
    run = start(plan(step("one"), step("two")))
    attempt = run.claim("one")
    pause(run)
    run.record("one", attempt)

    assert resume(run).status == RunStatus.RUNNING
    run.finish("two")
    assert run.refresh().status == RunStatus.COMPLETED
    assert not EscalationTicket.objects.exists()
