"""Escalation to people, in process (the engine's decisions; tests/integration/
test_escalation.py shows them on a real worker): each trigger, one ticket per run, each
resolution, the escalated timeout, and the abort conditions it sits beside."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.utils import timezone

from billing.models import Reservation
from billing.services import InsufficientCredits
from common.invariants import violations
from common.tools.base import ToolError
from orchestrator import sweeps
from runs import services
from runs.engine.outcomes import Outcome
from runs.models import EscalationTicket, StepFailure
from runs.outbox import RunMessage
from runs.people import approvals, escalations
from runs.selectors import run_history
from runs.states import InvalidTransition
from tests import factories
from tests.runs.engine.harness import EngineRun

Start = Callable[..., EngineRun]
QUICK = {"backoff": "fixed", "base_delay_ms": 0, "jitter": 0}


@pytest.fixture
def start(engine_run: Start) -> Start:
    return engine_run


def plan(*steps: dict[str, Any], task: dict[str, Any] | None = None, **run: Any) -> dict[str, Any]:
    return {
        "name": "escalation",
        "agents": [{"name": "a", "tasks": [{"name": "t", "steps": list(steps), **(task or {})}]}],
        **run,
    }


def flaky(name: str = "flaky", **retry: Any) -> dict[str, Any]:
    return {"name": name, "tool": "noop", "retry": {"max_attempts": 10, **QUICK, **retry}}


def ticket_of(run: EngineRun) -> EscalationTicket:
    return EscalationTicket.objects.get(run=run.run)


def assert_invariants_hold() -> None:
    assert violations() == {}


def fail_times(run: EngineRun, name: str, times: int, code: str = "timeout") -> None:
    for _ in range(times):
        run.fail(name, code, retryable=True)


# --------------------------------------------------------------------------- triggers
def test_the_sixth_failure_in_five_minutes_escalates_with_error_burst(start: Start) -> None:
    run = start(plan(flaky()))
    fail_times(run, "flaky", 5)
    assert run.refresh().status == "running"
    assert not EscalationTicket.objects.exists()

    held = run.fail("flaky", "timeout", retryable=True)

    assert run.refresh().status == "escalated"
    assert held.status == "pending"  # held for people, not failed
    ticket = ticket_of(run)
    assert (ticket.reason, ticket.status, ticket.severity) == ("error_burst", "open", "high")
    assert [(e["path"], e["attempt"], e["code"]) for e in ticket.errors] == [
        ("a.t.flaky", attempt, "timeout") for attempt in range(1, 7)
    ]
    assert run.run_messages(RunMessage.ESCALATED) == 1
    # Nothing new starts: the held step cannot be claimed while the run is escalated.
    with pytest.raises(AssertionError, match="could not be claimed"):
        run.finish("flaky")
    assert_invariants_hold()


def test_failures_older_than_the_window_are_not_counted(start: Start) -> None:
    run = start(plan(flaky(max_attempts=20)))
    fail_times(run, "flaky", 5)
    # Time travel: those five happened six minutes ago.
    StepFailure.objects.filter(run=run.run).update(created_at=timezone.now() - timedelta(minutes=6))
    fail_times(run, "flaky", 5)
    assert run.refresh().status == "running"

    run.fail("flaky", "timeout", retryable=True)
    assert run.refresh().status == "escalated"
    assert len(ticket_of(run).errors) == 6  # the window's, not the older five


def test_a_window_and_count_of_the_plans_own_apply(start: Start) -> None:
    run = start(plan(flaky(), escalation={"window": "1m", "max_errors": 2}))
    fail_times(run, "flaky", 2)
    assert run.refresh().status == "running"
    run.fail("flaky", "timeout", retryable=True)
    assert ticket_of(run).reason == "error_burst"


def test_an_error_rate_over_half_escalates_once_the_window_holds_ten_attempts(
    start: Start,
) -> None:
    steps = [{"name": f"ok{i}", "tool": "noop"} for i in range(5)]
    run = start(plan(*steps, flaky(), escalation={"max_errors": 100}))
    for i in range(5):
        run.finish(f"ok{i}")
    fail_times(run, "flaky", 5)  # 5 of 10 attempts failed: not over half
    assert run.refresh().status == "running"

    run.fail("flaky", "timeout", retryable=True)  # 6 of 11

    assert run.refresh().status == "escalated"
    assert ticket_of(run).reason == "error_rate"


def test_a_short_run_failing_every_attempt_does_not_escalate_by_rate(start: Start) -> None:
    run = start(plan(flaky(max_attempts=20), escalation={"max_errors": 100}))
    fail_times(run, "flaky", 9)  # 9 of 9 attempts failed, fewer than min_attempts
    assert run.refresh().status == "running"
    run.fail("flaky", "timeout", retryable=True)  # the tenth attempt
    assert ticket_of(run).reason == "error_rate"


def test_a_backoff_beyond_the_max_delay_the_plan_wrote_escalates(start: Start) -> None:
    retry = {"max_attempts": 10, "base_delay_ms": 100, "max_delay_ms": 300, "jitter": 0}
    run = start(plan({"name": "slow", "tool": "noop", "retry": retry}))
    fail_times(run, "slow", 2)  # 100 ms, then 200 ms
    assert run.refresh().status == "running"

    held = run.fail("slow", "timeout", retryable=True)  # 400 ms would exceed 300

    assert ticket_of(run).reason == "backoff_exceeded"
    assert ticket_of(run).severity == "medium"
    assert held.status == "pending"


def test_a_policy_without_max_delay_is_capped_never_escalated(start: Start) -> None:
    retry = {"max_attempts": 4, "base_delay_ms": 20_000, "jitter": 0}
    run = start(plan({"name": "slow", "tool": "noop", "retry": retry}))
    fail_times(run, "slow", 3)  # 20 s, 40 s capped at 30 s, 30 s
    assert run.refresh().status == "running"
    assert [m.countdown_s for m in run.transport.steps[-2:]] == [30.0, 30.0]
    run.fail("slow", "timeout", retryable=True)
    assert run.refresh().status == "failed"
    assert not EscalationTicket.objects.exists()


def test_attempts_exhausted_escalates_only_where_the_plan_says_so(start: Start) -> None:
    default = start(plan(flaky(max_attempts=2)))
    fail_times(default, "flaky", 2)
    assert default.refresh().status == "failed"
    assert default.run.last_error["code"] == "attempt_budget_exhausted"

    run = start(plan(flaky(max_attempts=2, on_exhausted="escalate")))
    fail_times(run, "flaky", 2)
    assert run.refresh().status == "escalated"
    assert ticket_of(run).reason == "attempts_exhausted"
    assert run.step("flaky").status == "pending"


def test_a_non_retryable_error_never_escalates(start: Start) -> None:
    run = start(plan(flaky(on_exhausted="escalate"), escalation={"max_errors": 0}))
    run.fail("flaky", "invalid_input", retryable=False)
    assert run.refresh().status == "failed"
    assert run.run.last_error["code"] == "invalid_input"
    assert not EscalationTicket.objects.exists()


def test_a_disabled_escalation_fails_as_before(start: Start) -> None:
    run = start(plan(flaky(max_attempts=8), escalation={"enabled": False}))
    fail_times(run, "flaky", 8)
    assert run.refresh().status == "failed"
    assert not EscalationTicket.objects.exists()


def test_a_run_that_keeps_failing_keeps_one_ticket(start: Start) -> None:
    steps = [flaky(f"f{i}") for i in range(4)]
    run = start(
        plan(
            *steps,
            task={"mode": "parallel", "max_concurrent_steps": 4},
            escalation={"max_errors": 2},
        )
    )
    # Three are running when the run escalates.
    claimed = {f"f{i}": run.claim(f"f{i}") for i in range(1, 4)}
    fail_times(run, "f0", 3)
    assert run.refresh().status == "escalated"
    for name, attempt in claimed.items():  # running ones finish and are recorded
        run.record(name, attempt, Outcome(error=ToolError("timeout", "slow", True)))

    assert EscalationTicket.objects.filter(run=run.run).count() == 1
    paths = {error["path"] for error in ticket_of(run).errors}
    assert paths == {f"a.t.f{i}" for i in range(4)}
    assert run.run_messages(RunMessage.ESCALATED) == 1
    assert_invariants_hold()


# --------------------------------------------------------------------------- resolving
def escalated(start: Start, **retry: Any) -> EngineRun:
    run = start(
        plan(
            flaky(max_attempts=2, on_exhausted="escalate", **retry),
            {"name": "after", "tool": "noop"},
        )
    )
    fail_times(run, "flaky", 2)
    assert run.refresh().status == "escalated"
    return run


def test_resume_gives_the_failed_step_its_retries_again(start: Start) -> None:
    run = escalated(start)
    with run.committed():
        ticket = escalations.escalation_resolve(
            ticket_id=ticket_of(run).pk, action="resume", actor="ops", note="fixed upstream"
        )
    assert (ticket.status, ticket.resolution, ticket.resolved_by) == ("resolved", "resume", "ops")
    assert run.refresh().status == "running"

    run.fail("flaky", "timeout", retryable=True)  # a fresh budget of two attempts
    assert run.step("flaky").status == "pending"
    run.finish("flaky")
    run.finish("after")
    assert run.refresh().status == "completed"
    assert run.step("flaky").attempts == 4
    assert_invariants_hold()


def test_retry_starts_a_new_attempt_and_settles_the_old(start: Start) -> None:
    run = escalated(start)
    with run.committed():
        escalations.escalation_resolve(ticket_id=ticket_of(run).pk, action="retry", actor="ops")

    current = run.refresh()
    assert (current.status, current.attempt_number) == ("retrying", 2)
    first = Reservation.objects.get(run_id=current.pk, attempt_number=1)
    assert first.settled_at is not None
    assert first.charged + first.refunded == first.reserved
    assert current.attempts.get(attempt_number=1).outcome == "failed"
    assert_invariants_hold()


def test_retry_without_credits_changes_nothing(start: Start) -> None:
    organization = factories.org(credits="1")
    spec = plan(flaky(max_attempts=2, on_exhausted="escalate"), credits="1")
    run = start(spec, organization=organization)
    fail_times(run, "flaky", 2)

    with pytest.raises(InsufficientCredits):
        escalations.escalation_resolve(ticket_id=ticket_of(run).pk, action="retry", actor="ops")
    assert run.refresh().status == "escalated"
    assert ticket_of(run).status == "open"


def test_cancel_cancels_and_refunds(start: Start) -> None:
    run = escalated(start)
    with run.committed():
        escalations.escalation_resolve(ticket_id=ticket_of(run).pk, action="cancel", actor="ops")
    current = run.refresh()
    assert current.status == "cancelled"
    assert current.last_error["code"] == "cancelled"
    assert Reservation.objects.get(run_id=current.pk).settled_at is not None
    assert ticket_of(run).resolution == "cancel"
    assert_invariants_hold()


def test_a_resolved_ticket_refuses_another_resolution(start: Start) -> None:
    run = escalated(start)
    escalations.escalation_resolve(ticket_id=ticket_of(run).pk, action="resume", actor="ops")
    with pytest.raises(escalations.EscalationResolved):
        escalations.escalation_resolve(ticket_id=ticket_of(run).pk, action="cancel", actor="ops")
    with pytest.raises(escalations.EscalationResolved):
        escalations.escalation_acknowledge(ticket_id=ticket_of(run).pk, actor="ops")
    with pytest.raises(ValueError, match="unknown action"):
        escalations.escalation_resolve(ticket_id=ticket_of(run).pk, action="ignore", actor="ops")


def test_acknowledging_is_recorded_once(start: Start) -> None:
    run = escalated(start)
    first = escalations.escalation_acknowledge(ticket_id=ticket_of(run).pk, actor="ops")
    again = escalations.escalation_acknowledge(ticket_id=ticket_of(run).pk, actor="other")
    assert (again.status, again.acknowledged_by) == ("acknowledged", "ops")
    assert again.acknowledged_at == first.acknowledged_at
    assert run_history(run.run).filter(message__contains="acknowledged").count() == 1


def test_an_operator_escalates_a_running_run(start: Start) -> None:
    run = start(plan({"name": "one", "tool": "noop"}, {"name": "two", "tool": "noop"}))
    attempt = run.claim("one")
    with run.committed():
        ticket = escalations.escalation_open(run_id=run.run.pk, actor="ops", note="looks wrong")
    assert (ticket.reason, ticket.note) == ("operator", "looks wrong")
    assert run.refresh().status == "escalated"
    run.record("one", attempt)  # claimed before: it finishes and is recorded
    assert run.step("two").dispatched_at is None  # nothing new starts
    assert escalations.escalation_open(run_id=run.run.pk, actor="ops").pk == ticket.pk

    escalations.escalation_resolve(ticket_id=ticket.pk, action="resume", actor="ops")
    run.finish("two")
    assert run.refresh().status == "completed"
    with pytest.raises(InvalidTransition):
        escalations.escalation_open(run_id=run.run.pk, actor="ops")
    assert_invariants_hold()


def test_an_approval_decided_while_escalated_counts_when_the_run_resumes(start: Start) -> None:
    steps = [{"name": "ask", "tool": "approval"}, flaky(max_attempts=1, on_exhausted="escalate")]
    run = start(plan(*steps, task={"mode": "parallel"}))
    run.fail("flaky", "timeout", retryable=True)
    assert run.refresh().status == "escalated"

    decided = approvals.run_approve(run_id=run.run.pk, actor="ops")
    assert [step.name for step in decided.steps] == ["ask"]
    escalations.escalation_resolve(ticket_id=ticket_of(run).pk, action="resume", actor="ops")
    run.finish("flaky")
    assert run.refresh().status == "completed"
    assert_invariants_hold()


# --------------------------------------------------------------------------- run's end
def test_an_escalated_run_fails_after_its_escalation_timeout(start: Start) -> None:
    run = start(plan(flaky(max_attempts=1, on_exhausted="escalate"), timeouts={"escalated": "1h"}))
    run.fail("flaky", "timeout", retryable=True)
    assert sweeps.sweep_timeouts(now=timezone.now() + timedelta(minutes=59)) == {}

    counts = sweeps.sweep_timeouts(now=timezone.now() + timedelta(hours=1, minutes=1))

    assert counts == {"escalation_timeout": 1}
    current = run.refresh()
    assert (current.status, current.last_error["code"]) == ("failed", "escalation_timeout")
    ticket = ticket_of(run)
    assert (ticket.status, ticket.resolution) == ("resolved", "escalation_timeout")
    assert Reservation.objects.get(run_id=current.pk).settled_at is not None
    assert_invariants_hold()


def test_a_failure_that_cannot_wait_ends_the_escalated_run_and_its_ticket(start: Start) -> None:
    steps = [flaky("a1", max_attempts=1, on_exhausted="escalate"), {"name": "a2", "tool": "noop"}]
    run = start(plan(*steps, task={"mode": "parallel"}))
    attempt = run.claim("a2")
    run.fail("a1", "timeout", retryable=True)
    assert run.refresh().status == "escalated"

    # fail-fast: the run fails
    run.record("a2", attempt, Outcome(error=ToolError("invalid_input", "bad", False)))

    assert run.refresh().status == "failed"
    assert (ticket_of(run).status, ticket_of(run).resolution) == ("resolved", "run_ended")
    assert_invariants_hold()


# --------------------------------------------------------------------------- aborts
def test_a_run_retry_without_credits_fails_naming_insufficient_credits(start: Start) -> None:
    # Its first attempt's refund leaves 0.01 too little for the second.
    organization = factories.org(credits="0.6")
    spec = plan({"name": "bad", "tool": "noop"}, failure_mode="retry", credits="0.6")
    run = start(spec, organization=organization)
    run.fail("bad", "invalid_input", retryable=False)

    current = run.refresh()
    assert (current.status, current.attempt_number) == ("failed", 1)
    assert current.last_error["code"] == "insufficient_credits"
    assert current.last_error["cause"]["code"] == "invalid_input"
    assert Reservation.objects.get(run_id=current.pk).refunded == Decimal("0.59")
    assert_invariants_hold()


def test_a_cancel_names_its_condition(start: Start) -> None:
    run = start(plan({"name": "one", "tool": "noop"}))
    services.run_cancel(run_id=run.run.pk, reason="no longer needed")
    assert run.refresh().last_error == {"code": "cancelled", "message": "no longer needed"}
