"""A durable wait holds no message and outlives its worker: a `wait` step parked beyond
the step-message horizon (an hour, past the 300 s of `RATE_LIMIT_MAX_COUNTDOWN_S`) has no
message in the broker (neither queued nor held by a worker with a countdown), before and
after its worker is stopped and another started, and once its time comes within the
horizon the wake sweep sends its message and a worker wakes it at its time, never
before (docs/engine.md, "Timers").

The worker here is this module's own, stopped and started again; the session's may be
running beside it (it behaves the same). The hour is not waited for: the step's row, its
timer, is moved to a few seconds ahead, as it would read an hour later, and the sweep is
the test's to send, as beat would once that time is within the horizon."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from django.db.models.functions import Now
from pytest_django.fixtures import Settings

from config.celery import WORKER_QUEUES, app
from runs.engine import dispatch
from runs.models import Step
from runs.states import RunStatus
from tests.integration.engine_support import assert_books_balanced, submit, wait_for
from tests.integration.timer_support import parked, step_messages, waits_plan
from tests.support import Child, child_env, wait_until, worker_cmd

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

SOON = timedelta(seconds=4)
LATE_S = 3.0


class Worker:
    """Real workers of this test, one at a time."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.current: Child | None = None
        self.started = 0

    def start(self) -> None:
        self.started += 1
        hostname = f"timers-{uuid.uuid4().hex[:8]}@localhost"
        child = Child(
            worker_cmd(hostname, ",".join(WORKER_QUEUES)),
            child_env(),
            self.directory / f"worker-{self.started}.log",
        )
        self.current = child

        def answered() -> bool:
            if not child.alive():
                raise AssertionError(f"worker exited early:\n{child.output()}")
            replies = app.control.ping(destination=[hostname], timeout=0.5) or []
            return any(hostname in reply for reply in replies)

        wait_until(answered, timeout=60, what="the test's worker to answer a ping")

    def stop(self) -> None:
        if self.current is not None:
            # A warm shutdown, as a deployment restarts it: SIGTERM to the main process.
            self.current.stop(timeout=20, leader_only=True)
            self.current.kill_group()
            self.current = None


@pytest.fixture
def worker(tmp_path: Path, settings: Settings) -> Iterator[Worker]:
    settings.ORCHESTRATOR_DISPATCH_ENABLED = True  # this test's own worker executes
    workers = Worker(tmp_path)
    workers.start()
    try:
        yield workers
    finally:
        workers.stop()


def test_a_wait_beyond_the_horizon_has_no_message_and_the_sweep_wakes_it_on_time_after_a_restart(
    worker: Worker,
) -> None:
    run = submit(waits_plan(1, 3600, then=1))
    (step,) = parked(run, 1)

    assert Step.objects.get(pk=step.pk).asleep
    assert step_messages(step) == []  # nothing queued, nothing held with a countdown
    worker.stop()
    assert Step.objects.get(pk=step.pk).waiting_reason == "timer"  # parked in PostgreSQL
    worker.start()
    assert step_messages(step) == []

    # The hour has passed, but for a few seconds (by the database's clock, the claim's).
    wake = Step.objects.annotate(now=Now()).values_list("now", flat=True).get(pk=step.pk) + SOON
    Step.objects.filter(pk=step.pk).update(next_run_at=wake)
    assert dispatch.asleep_next_due() == wake - timedelta(seconds=300)
    assert dispatch.wake_asleep() == 1  # as beat sends it, its time within the horizon
    assert dispatch.wake_asleep() == 0  # sent once
    done = wait_for(run, timeout=60)
    assert done.status == RunStatus.COMPLETED
    woken = Step.objects.get(pk=step.pk)
    assert woken.started_at is not None
    assert woken.started_at >= wake  # never early
    assert woken.started_at - wake < timedelta(seconds=LATE_S)
    assert (woken.attempts, woken.asleep) == (1, False)
    assert_books_balanced(done)
