"""Every timeout, with time travel: each ends in the state its state machine gives
(runs/states.py)."""

from __future__ import annotations

import io
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.utils import timezone

from artifacts import services as artifact_services
from artifacts.models import Artifact
from artifacts.selectors import artifact_get
from common.invariants import violations
from orchestrator import sweeps
from runs import services
from runs.engine import control
from runs.engine.start import run_start
from runs.models import Agent, Run, RunAttempt, Task
from runs.plan import PlanInvalid
from runs.selectors import run_history
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


def test_a_run_never_started_is_cancelled_after_the_created_run_ttl() -> None:
    run = factories.run()

    assert sweeps.timeouts_next_due() == run.status_changed_at + timedelta(days=7)
    assert sweeps.sweep_timeouts(now=later(timedelta(days=6, hours=23))) == {}
    counts = sweeps.sweep_timeouts(now=later(timedelta(days=7, minutes=1)))

    run = Run.objects.get(pk=run.pk)
    assert counts == {"created_timeout": 1}
    assert run.status == "cancelled"
    assert run.completed_at is not None
    assert run.last_error["code"] == "created_timeout"
    assert run.last_error["message"] == "created timeout: created for more than 7d"
    assert_consistent(run)


def test_the_created_run_ttl_is_the_servers_setting_not_the_plans(settings: Any) -> None:
    settings.RUN_TIMEOUT_DEFAULTS = {**settings.RUN_TIMEOUT_DEFAULTS, "created": 60}
    run = factories.run()
    started_in_time = started()

    assert sweeps.sweep_timeouts(now=later(timedelta(seconds=61))) == {"created_timeout": 1}
    assert Run.objects.get(pk=run.pk).status == "cancelled"
    assert Run.objects.get(pk=started_in_time.pk).status == "pending"
    with pytest.raises(PlanInvalid) as refused:
        factories.run(timeouts={"created": "30d"})
    assert [error.path for error in refused.value.errors] == ["timeouts.created"]


def test_runs_never_started_are_cancelled_in_batches_once_each(settings: Any) -> None:
    settings.ENGINE_SWEEP_BATCH = 2
    runs = [factories.run() for _ in range(3)]
    when = later(timedelta(days=8))

    counts = [sweeps.sweep_timeouts(now=when) for _ in range(3)]

    assert counts == [{"created_timeout": 2}, {"created_timeout": 1}, {}]
    assert {Run.objects.get(pk=run.pk).status for run in runs} == {"cancelled"}
    assert sweeps.timeouts_next_due() is None


def expiry_of(artifact: Artifact) -> datetime | None:
    # Any: `expires_at` is the selector's annotation, not a field.
    shown: Any = artifact_get(organization=artifact.organization, artifact_id=artifact.pk)
    expires_at: datetime | None = shown.expires_at
    return expires_at


def test_the_artifacts_of_a_run_never_started_expire_once_it_is_cancelled(
    settings: Any,
) -> None:
    settings.ARTIFACT_RETENTION_DAYS = 30
    run = factories.run()
    artifact = artifact_services.upload(
        organization=run.organization,
        run_id=run.pk,
        name="input.csv",
        stream=io.BytesIO(b"a,b"),
        size=3,
    )
    assert expiry_of(artifact) is None

    sweeps.sweep_timeouts(now=later(timedelta(days=7, minutes=1)))

    ended = Run.objects.get(pk=run.pk).completed_at
    assert ended is not None
    assert expiry_of(artifact) == ended + timedelta(days=30)
    assert artifact_services.sweep(now=later(timedelta(days=29)))["expired"] == 0
    swept = artifact_services.sweep(now=later(timedelta(days=31)))
    assert (swept["expired"], swept["deleted"]) == (1, 1)
    assert Artifact.objects.get(pk=artifact.pk).status == "deleted"


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
    assert run_history(run).filter(message__contains="presumed lost").count() == 1


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
