"""Local continuation: a worker runs the steps that become ready as it records one.

Each step is still claimed (RUNNING, a lease, its event) and recorded in its own
transaction before the next starts; only the broker hop between them is saved. These
tests drive ``execute_step`` in process, with the engine's messages recorded instead of
published, so what went through the queue and what did not is visible.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from orchestrator import executor
from orchestrator.sweeps import reclaim_expired_leases
from orchestrator.tasks import execute_step_task
from runs import services
from runs.engine import control
from runs.engine.outcomes import Outcome
from runs.models import Run, RunEvent, Step
from tests import factories
from tests.support import RecordingTransport

pytestmark = pytest.mark.django_db

Capture = Callable[..., Any]


def names(transport: RecordingTransport) -> list[str]:
    by_id = dict(Step.objects.values_list("pk", "name"))
    return [by_id[message.step_id] for message in transport.steps]


def started(capture: Capture, steps: list[dict[str, Any]]) -> Run:
    spec = factories.plan(steps=0)
    spec["agents"][0]["tasks"][0]["steps"] = steps
    run = services.run_create(organization=factories.org(), spec=spec)
    with capture(execute=True):
        services.run_start(run_id=run.pk)
    with capture(execute=True):
        assert control.pick_up(run.pk)
    return run


def noops(count: int) -> list[dict[str, Any]]:
    return [factories.step(f"step-{index}") for index in range(count)]


def execute(capture: Capture, run: Run, name: str, deadline_s: float | None = 60) -> str:
    step = Step.objects.get(run=run, name=name)
    deadline = None if deadline_s is None else time.monotonic() + deadline_s
    with capture(execute=True):
        return executor.execute_step(step.pk, worker="w", task_id="task-1", deadline=deadline)


def statuses(run: Run) -> list[str]:
    return list(Step.objects.filter(run=run).order_by("position").values_list("status", flat=True))


def test_a_sequence_runs_in_one_task_each_step_claimed_and_committed_in_turn(
    transport: RecordingTransport, django_capture_on_commit_callbacks: Capture
) -> None:
    run = started(django_capture_on_commit_callbacks, noops(5))
    assert names(transport) == ["step-0"]

    assert execute(django_capture_on_commit_callbacks, run, "step-0") == "completed"

    assert statuses(run) == ["completed"] * 5
    assert Run.objects.get(pk=run.pk).status == "completed"
    assert names(transport) == ["step-0"]  # nothing else went through the queue
    for step in Step.objects.filter(run=run):
        moves = RunEvent.objects.filter(entity="step", entity_id=str(step.pk)).order_by("pk")
        assert [(e.from_status, e.to_status) for e in moves] == [
            ("pending", "running"),
            ("running", "completed"),
        ]
        assert step.celery_task_id == "task-1"  # a revoke of this task reaches each of them


def test_the_burst_stops_at_its_step_budget_and_queues_the_next(
    transport: RecordingTransport, django_capture_on_commit_callbacks: Capture, settings: Any
) -> None:
    settings.ENGINE_BURST_STEPS = 3
    run = started(django_capture_on_commit_callbacks, noops(5))

    execute(django_capture_on_commit_callbacks, run, "step-0")

    assert statuses(run) == ["completed", "completed", "completed", "pending", "pending"]
    assert names(transport) == ["step-0", "step-3"]


def test_a_step_whose_timeout_does_not_fit_before_the_deadline_goes_to_the_queue(
    transport: RecordingTransport, django_capture_on_commit_callbacks: Capture
) -> None:
    run = started(django_capture_on_commit_callbacks, noops(2))  # default timeout: 30 s

    execute(django_capture_on_commit_callbacks, run, "step-0", deadline_s=20)

    assert statuses(run) == ["completed", "pending"]
    assert names(transport) == ["step-0", "step-1"]


def test_without_a_deadline_each_step_is_its_own_task(
    transport: RecordingTransport, django_capture_on_commit_callbacks: Capture
) -> None:
    run = started(django_capture_on_commit_callbacks, noops(2))

    execute(django_capture_on_commit_callbacks, run, "step-0", deadline_s=None)

    assert names(transport) == ["step-0", "step-1"]


def test_a_pause_during_a_burst_starts_nothing_new(
    transport: RecordingTransport,
    django_capture_on_commit_callbacks: Capture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    run = started(django_capture_on_commit_callbacks, noops(3))
    real = executor.run_attempt

    def pausing(step: Step, attempt: int) -> Outcome:
        if step.name == "step-1":
            services.run_pause(run_id=run.pk)  # an operator, while the step runs
        return real(step, attempt)

    monkeypatch.setattr(executor, "run_attempt", pausing)

    execute(django_capture_on_commit_callbacks, run, "step-0")

    assert statuses(run) == ["completed", "completed", "paused"]  # the running one finished
    assert Run.objects.get(pk=run.pk).status == "paused"


def test_a_worker_lost_mid_burst_leaves_the_claimed_step_to_the_lease_sweep(
    transport: RecordingTransport,
    django_capture_on_commit_callbacks: Capture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    run = started(django_capture_on_commit_callbacks, noops(2))
    real = executor.run_attempt

    def dying(step: Step, attempt: int) -> Outcome:
        if step.name == "step-1":
            raise SystemExit("the worker process is gone")
        return real(step, attempt)

    monkeypatch.setattr(executor, "run_attempt", dying)
    with pytest.raises(SystemExit):
        execute(django_capture_on_commit_callbacks, run, "step-0")

    lost = Step.objects.get(run=run, name="step-1")
    assert (lost.status, lost.attempts) == ("running", 1)  # claimed as step-0 was recorded
    Step.objects.filter(pk=lost.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    with django_capture_on_commit_callbacks(execute=True):
        assert reclaim_expired_leases() == {"reclaimed": 1, "failed": 0}
    assert Step.objects.get(pk=lost.pk).status == "pending"
    assert names(transport)[-1] == "step-1"  # sent again, to any worker


def test_each_step_of_a_burst_gets_its_own_timeout(
    transport: RecordingTransport, django_capture_on_commit_callbacks: Capture
) -> None:
    slow = factories.step("slow", "sleep", params={"seconds": 30}, timeout="1s")
    run = started(django_capture_on_commit_callbacks, [*noops(1), slow])
    started_at = time.monotonic()

    execute(django_capture_on_commit_callbacks, run, "step-0")

    assert time.monotonic() - started_at < 10
    timed_out = Step.objects.get(run=run, name="slow")
    assert timed_out.error is not None
    assert timed_out.error["code"] == "timeout"
    assert (timed_out.status, timed_out.failures) == ("pending", 1)  # retried later, queued
    assert names(transport)[-1] == "slow"


def test_a_recording_replayed_after_a_database_error_records_the_step_that_ran(
    transport: RecordingTransport, django_capture_on_commit_callbacks: Capture
) -> None:
    run = started(django_capture_on_commit_callbacks, noops(2))
    first = Step.objects.get(run=run, name="step-0")
    claimed = executor.claim(first.pk, "w", "task-1")
    assert claimed is not None
    # The task was sent for another step; in a burst, the step that ran is in the replay.
    error = executor.RecordFailed(first.pk, run.pk, claimed.attempts, Outcome(output={}))

    with django_capture_on_commit_callbacks(execute=True):
        result = execute_step_task.run(step_id=-1, replay=error.replay)

    assert result == "recorded"
    assert Step.objects.get(pk=first.pk).status == "completed"
