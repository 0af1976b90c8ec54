"""Steering runs on a real worker: cancel, pause/resume, retry, lost messages."""

from __future__ import annotations

import contextlib
import random
import time
from typing import Any

import pytest
import redis
from django.utils import timezone

from config.celery import QUEUE_STEPS, app
from orchestrator import sweeps
from runs import services
from runs.engine.start import run_start
from runs.models import Run, RunAttempt, Step
from runs.people import approvals
from runs.selectors import run_history
from runs.states import InvalidTransition
from tests import factories
from tests.factories import step
from tests.integration.engine_support import assert_books_balanced, steps_of, submit, wait_for
from tests.support import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def task_plan(steps: list[dict[str, Any]], **task: Any) -> dict[str, Any]:
    return {
        "name": "control",
        "agents": [{"name": "a", "tasks": [{"name": "t", "steps": steps, **task}]}],
    }


def sleepers(count: int, seconds: float) -> list[dict[str, Any]]:
    return [step(f"s{i}", "sleep", params={"seconds": seconds}) for i in range(count)]


def running_count(run: Run) -> int:
    return Step.objects.filter(run=run, status="running").count()


def no_step_task_active(worker: str) -> bool:
    active = app.control.inspect(destination=[worker], timeout=1.0).active() or {}
    return not any(
        job.get("name") == "orchestrator.steps.execute" for jobs in active.values() for job in jobs
    )


def assert_cancelled_cleanly(run: Run, cancelled_at: Any, worker: str) -> None:
    run = Run.objects.get(pk=run.pk)
    assert run.status == "cancelled"
    assert running_count(run) == 0  # in the database, at once
    statuses = set(Step.objects.filter(run=run).values_list("status", flat=True))
    assert statuses <= {"completed", "cancelled"}
    # ...and in the worker within a bounded time: the tools were terminated.
    wait_until(lambda: no_step_task_active(worker), timeout=15, what="running steps to stop")
    late = Step.objects.filter(run=run, status="completed", completed_at__gt=cancelled_at)
    assert not late.exists()
    assert_books_balanced(run)


def test_cancel_during_a_wide_parallel_task_stops_everything(celery_worker: str) -> None:
    run = submit(task_plan(sleepers(30, 5), mode="parallel", max_concurrent_steps=30))
    wait_until(lambda: running_count(run) >= 2, timeout=30, what="two steps running")

    services.run_cancel(run_id=run.pk, reason="enough")
    cancelled_at = timezone.now()

    assert_cancelled_cleanly(run, cancelled_at, celery_worker)
    assert Run.objects.get(pk=run.pk).cancel_reason == "enough"


def test_cancel_during_a_long_sequential_task_stops_it(celery_worker: str) -> None:
    run = submit(task_plan(sleepers(2, 0.05) + sleepers(6, 5)[2:]))
    wait_until(
        lambda: (
            Step.objects.filter(run=run, status="completed").count() == 2
            and running_count(run) == 1
        ),
        timeout=30,
        what="the third step to run",
    )

    services.run_cancel(run_id=run.pk)
    cancelled_at = timezone.now()

    assert_cancelled_cleanly(run, cancelled_at, celery_worker)


def test_cancel_racing_completion_ends_each_run_in_exactly_one_terminal_state(
    celery_worker: str,
) -> None:
    rng = random.Random(7)
    organization = factories.org(credits=100)
    runs = []
    for _ in range(150):
        run = services.run_create(organization=organization, plan=task_plan([step("only")]))
        run_start(run_id=run.pk)
        if rng.random() < 0.6:  # vary the moment: queued, picked up, mid-step, finished
            time.sleep(rng.random() * 0.03)  # jitter to vary the race, not synchronisation
        with contextlib.suppress(InvalidTransition):  # completion may win: run COMPLETED
            services.run_cancel(run_id=run.pk, reason="race")
        runs.append(run)

    outcomes = set()
    for run in runs:
        done = wait_for(run)
        outcomes.add(done.status)
        terminal = run_history(run).filter(
            entity="run", to_status__in=["completed", "cancelled", "failed"]
        )
        assert terminal.count() == 1
        assert done.status in ("completed", "cancelled")
        assert_books_balanced(run, check_invariants=False)
    assert "cancelled" in outcomes
    assert_books_balanced(runs[0])  # and every invariant over the whole database, once


def test_pause_during_a_fan_out_starts_nothing_new_and_resume_finishes(celery_worker: str) -> None:
    run = submit(task_plan(sleepers(12, 0.3), mode="parallel", max_concurrent_steps=4))
    wait_until(
        lambda: Step.objects.filter(run=run, status="completed").count() >= 2,
        timeout=30,
        what="the fan-out to be under way",
    )

    services.run_pause(run_id=run.pk)
    paused_at = timezone.now()
    wait_until(lambda: running_count(run) == 0, timeout=30, what="running steps to finish")

    steps = Step.objects.filter(run=run)
    assert not steps.filter(started_at__gt=paused_at).exists()
    assert steps.filter(status="paused").exists()
    finished_during_pause = steps.filter(completed_at__gt=paused_at, status="completed")
    assert all(s.output == {"slept": 0.3} for s in finished_during_pause)  # results kept

    services.run_resume(run_id=run.pk)
    done = wait_for(run)

    assert done.status == "completed", done.last_error
    assert set(Step.objects.filter(run=run).values_list("status", flat=True)) == {"completed"}
    events = list(
        run_history(run).filter(entity="run", kind="transition").values_list("to_status", flat=True)
    )
    assert events[-4:] == ["paused", "resuming", "running", "completed"]
    assert_books_balanced(run)


def test_retry_after_failure_runs_attempt_two_with_its_own_reservation(celery_worker: str) -> None:
    flaky = step("gate", "fail", params={"code": "not_found"}, when="${run.attempt} == 1")
    run = submit(task_plan([flaky, step("work")]) | {"credits": 3})
    first = wait_for(run)
    assert first.status == "failed"
    attempt_one = {(s.pk, s.status) for s in Step.objects.filter(run=run)}

    services.run_retry(run_id=run.pk)
    # wait_for would see attempt 1's FAILED before the worker moves the run on.
    wait_until(
        lambda: Run.objects.get(pk=run.pk).status == "completed",
        timeout=60,
        what="attempt 2 to complete",
    )
    done = Run.objects.get(pk=run.pk)

    assert done.attempt_number == 2
    attempts = list(RunAttempt.objects.filter(run=run).order_by("attempt_number"))
    assert [a.outcome for a in attempts] == ["failed", "completed"]
    assert [a.reservation.reserved for a in attempts] == [3, 3]
    assert {(s.pk, s.status) for s in Step.objects.filter(run=run, attempt_number=1)} == attempt_one
    assert steps_of(run)["gate"].status == "skipped"
    assert_books_balanced(run)


def test_a_step_whose_message_was_deleted_from_redis_is_sent_again(
    celery_worker: str, broker: redis.Redis[bytes]
) -> None:
    # A pick-up serves its run's first steps itself, without a message: the step whose
    # message is lost here is made ready by an approval, given in this process.
    run = submit(task_plan([step("gate", "approval"), step("first"), step("second")]))
    wait_until(
        lambda: Run.objects.get(pk=run.pk).status == "waiting_approval",
        timeout=30,
        what="the run to wait for its approval",
    )
    app.control.cancel_consumer(QUEUE_STEPS, destination=[celery_worker], reply=True)
    try:
        approvals.run_approve(run_id=run.pk, actor="test")
        wait_until(
            lambda: Step.objects.filter(
                run=run, name="first", dispatched_at__isnull=False
            ).exists(),
            timeout=30,
            what="the first step to be dispatched",
        )
        # The message is in Redis, unconsumed: delete it (every priority list of the queue).
        wait_until(lambda: broker.keys(f"{QUEUE_STEPS}*"), timeout=10, what="the message in Redis")
        for key in broker.keys(f"{QUEUE_STEPS}*"):
            if key.decode().split(":")[0] == QUEUE_STEPS and broker.type(key) == b"list":
                broker.delete(key)
    finally:
        app.control.add_consumer(QUEUE_STEPS, destination=[celery_worker], reply=True)

    counts = sweeps.redispatch_lost(older_than=0)
    done = wait_for(run)

    assert counts["steps"] == 1
    assert done.status == "completed", done.last_error
    assert steps_of(run)["first"].attempts == 1
    assert_books_balanced(run)
