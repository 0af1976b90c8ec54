"""Every timeout, with time travel: each ends in the state SPEC section 4 gives."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from django.utils import timezone

from common.invariants import violations
from orchestrator import sweeps
from runs import services
from runs.engine import control
from runs.engine.start import run_start
from runs.models import Agent, Run, RunAttempt, Task
from tests import factories

pytestmark = pytest.mark.django_db

HOUR = timedelta(hours=1)


def later(delta: timedelta) -> datetime:
    return timezone.now() + delta


def assert_consistent(run: Run) -> None:
    attempt = RunAttempt.objects.filter(run=run).order_by("-attempt_number").first()
    if attempt is not None:
        assert attempt.reservation.settled_at is not None
        assert (
            attempt.reservation.charged + attempt.reservation.refunded
            == attempt.reservation.reserved
        )
    assert violations() == {}


def started(**options: object) -> Run:
    run = factories.run(**options)  # type: ignore[arg-type]
    return run_start(run_id=run.pk)


def running(**options: object) -> Run:
    run = started(**options)
    control.pick_up(run.pk)  # in this process; dispatch is off, so nothing is sent
    return Run.objects.get(pk=run.pk)


def test_pending_for_more_than_24h_fails_and_refunds() -> None:
    run = started()

    assert sweeps.sweep_timeouts(now=later(23 * HOUR)) == {}
    counts = sweeps.sweep_timeouts(now=later(25 * HOUR))

    run = Run.objects.get(pk=run.pk)
    assert counts == {"pending_timeout": 1}
    assert run.status == "failed"
    assert run.last_error["code"] == "pending_timeout"
    assert "more than 1d" in run.last_error["message"]
    assert_consistent(run)


def test_paused_for_more_than_7_days_is_cancelled() -> None:
    run = running()
    services.run_pause(run_id=run.pk)

    sweeps.sweep_timeouts(now=later(timedelta(days=7, minutes=1)))

    run = Run.objects.get(pk=run.pk)
    assert run.status == "cancelled"
    assert run.last_error["code"] == "paused_timeout"
    assert_consistent(run)


def test_resuming_for_more_than_5_minutes_fails() -> None:
    run = running()
    services.run_pause(run_id=run.pk)
    services.run_resume(run_id=run.pk)

    sweeps.sweep_timeouts(now=later(timedelta(minutes=6)))

    run = Run.objects.get(pk=run.pk)
    assert (run.status, run.last_error["code"]) == ("failed", "resuming_timeout")
    assert_consistent(run)


def test_retrying_for_more_than_24h_fails() -> None:
    run = running()
    services.run_fail(run_id=run.pk, code="tool_error", message="boom")
    services.run_retry(run_id=run.pk)

    sweeps.sweep_timeouts(now=later(25 * HOUR))

    run = Run.objects.get(pk=run.pk)
    assert (run.status, run.last_error["code"]) == ("failed", "retrying_timeout")
    assert_consistent(run)


def test_a_run_running_past_its_timeout_fails_with_its_agents() -> None:
    run = running(timeouts={"run": "2h"})

    assert sweeps.sweep_timeouts(now=later(timedelta(minutes=50))) == {}
    sweeps.sweep_timeouts(now=later(3 * HOUR))

    run = Run.objects.get(pk=run.pk)
    assert (run.status, run.last_error["code"]) == ("failed", "run_timeout")
    assert set(Agent.objects.filter(run=run).values_list("status", flat=True)) == {"failed"}
    assert_consistent(run)


def test_a_task_past_its_timeout_fails_and_fail_fast_fails_the_run() -> None:
    run = running(timeouts={"task": "10m"})

    sweeps.sweep_timeouts(now=later(timedelta(minutes=11)))

    run = Run.objects.get(pk=run.pk)
    assert (run.status, run.last_error["code"]) == ("failed", "task_timeout")
    assert Task.objects.get(run=run).status == "failed"
    assert_consistent(run)


def test_an_agent_past_its_timeout_fails_and_a_continue_run_carries_on() -> None:
    organization = factories.org()
    spec = factories.plan(agents=2, name="x") | {
        "failure_mode": "continue",
        "timeouts": {"agent": "1h"},
    }
    run = services.run_create(organization=organization, plan=spec)
    run_start(run_id=run.pk)
    control.pick_up(run.pk)
    slow, fast = Agent.objects.filter(run=run).order_by("position")
    # The other agent (and its task) started later: not overdue.
    Agent.objects.filter(pk=fast.pk).update(started_at=timezone.now() + 2 * HOUR)
    Task.objects.filter(agent=fast).update(started_at=timezone.now() + 2 * HOUR)

    sweeps.sweep_timeouts(now=later(timedelta(minutes=61)))

    slow.refresh_from_db()
    assert slow.status == "skipped"
    assert slow.last_error["code"] == "agent_timeout"
    assert Run.objects.get(pk=run.pk).status == "running"


def test_sweeping_twice_does_nothing_the_second_time() -> None:
    run = started()
    when = later(25 * HOUR)

    first = sweeps.sweep_timeouts(now=when)
    second = sweeps.sweep_timeouts(now=when)

    assert first == {"pending_timeout": 1}
    assert second == {}
    assert Run.objects.get(pk=run.pk).status == "failed"


def test_lost_step_messages_are_sent_again_once_overdue() -> None:
    run = running(steps=2)

    assert sweeps.redispatch_lost(now=later(timedelta(seconds=10))) == {
        "steps": 0,
        "runs": 0,
        "replans": 0,
        "notices": 0,
        "admissions": 0,
    }
    counts = sweeps.redispatch_lost(now=later(timedelta(minutes=5)))

    assert counts == {
        "steps": 1,
        "runs": 0,
        "replans": 0,
        "notices": 0,
        "admissions": 0,
    }  # the first step of the sequence
    assert run.events.filter(message__contains="presumed lost").count() == 1


def test_a_pending_run_whose_pick_up_was_lost_is_sent_again_once_per_threshold() -> None:
    started()

    assert sweeps.redispatch_lost(now=later(timedelta(minutes=5))) == {
        "steps": 0,
        "runs": 1,
        "replans": 0,
        "notices": 0,
        "admissions": 0,
    }
    assert sweeps.redispatch_lost(now=later(timedelta(minutes=6))) == {
        "steps": 0,
        "runs": 0,
        "replans": 0,
        "notices": 0,
        "admissions": 0,
    }
    assert sweeps.redispatch_lost(now=later(timedelta(minutes=8))) == {
        "steps": 0,
        "runs": 1,
        "replans": 0,
        "notices": 0,
        "admissions": 0,
    }
