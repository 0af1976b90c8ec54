"""A durable wait holds no message and outlives its worker: a `wait` step parked beyond
the step-message horizon has no message in the broker (neither queued nor held by a
worker with a countdown), and the wake sweep wakes it at its time and never before, by a
worker started after the one that parked it was stopped.

The worker here is this module's own (the session's would answer for it), started with
`RATE_LIMIT_MAX_COUNTDOWN_S=2`, as the test drives the wake sweep: the wait of 8 s is
beyond that horizon, as a wait of days is beyond the 300 s of a deployment (docs/engine.md,
"Timers"). The sweep is the test's to send (as beat would, once the step's time is within
the horizon), not beat's."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone
from pytest_django.fixtures import Settings

from config.celery import WORKER_QUEUES, app
from runs.engine import dispatch
from runs.models import Step
from runs.states import RunStatus
from tests.integration.engine_support import assert_books_balanced, submit, wait_for
from tests.integration.timer_support import parked, step_messages, waits_plan, wake_of
from tests.support import Child, child_env, wait_until, worker_cmd

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

WAIT_S = 8.0
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
            child_env(RATE_LIMIT_MAX_COUNTDOWN_S="2"),
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
    worker: Worker, settings: Settings
) -> None:
    settings.RATE_LIMIT_MAX_COUNTDOWN_S = 2  # the worker's horizon, for the test's sweep
    run = submit(waits_plan(1, WAIT_S, then=1))
    (step,) = parked(run, 1)
    wake = wake_of(step)

    assert Step.objects.get(pk=step.pk).asleep
    assert step_messages(step) == []  # nothing queued, nothing held with a countdown
    worker.stop()
    assert Step.objects.get(pk=step.pk).waiting_reason == "timer"  # parked in PostgreSQL
    worker.start()
    assert step_messages(step) == []

    # As beat would: the sweep sends the step's message once its time is within the
    # horizon, and only then.
    assert wait_until(dispatch.wake_asleep, timeout=WAIT_S + 30, what="the wake sweep") == 1
    assert wake - timezone.now() <= timedelta(seconds=2)
    assert dispatch.wake_asleep() == 0  # sent once
    done = wait_for(run, timeout=WAIT_S + 60)
    assert done.status == RunStatus.COMPLETED
    woken = Step.objects.get(pk=step.pk)
    assert woken.started_at is not None
    assert woken.started_at >= wake  # never early
    assert woken.started_at - wake < timedelta(seconds=LATE_S)
    assert (woken.attempts, woken.asleep) == (1, False)
    assert_books_balanced(done)
