"""Doorbells, in process: a worker answering one serves its run's claimable steps one
after another, within its burst budget, each step under its own time limits; and the
transport rings as many doorbells as a run's ready steps need.

The same path with a real worker and broker is in tests/integration/test_doorbells.py.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Any

import pytest
from django.db import OperationalError, transaction

from config.celery import app
from orchestrator import executor
from orchestrator.tasks import doorbell_task, pick_up_run_task
from orchestrator.transport import (
    DOORBELL_TASK,
    EXECUTE_STEP_TASK,
    PICK_UP_TASK,
    CeleryTransport,
    pick_up_limits,
    serving,
)
from runs import services
from runs.engine import control, hotpath
from runs.engine.outcomes import record_and_claim
from runs.engine.start import run_start
from runs.models import Run, Step
from runs.outbox import Outbox, StepMessage
from tests import factories
from tests.factories import step
from tests.support import ROOT, child_env

if TYPE_CHECKING:
    from pytest_django.fixtures import Settings as SettingsWrapper

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def rings(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, int]]:
    """What the doorbell rang again for (nothing leaves the process)."""
    rung: list[dict[str, int]] = []
    monkeypatch.setattr(CeleryTransport, "ring", lambda self, runs, reason: rung.append(dict(runs)))
    return rung


def started(*steps: dict[str, Any], **task: Any) -> Run:
    spec = factories.plan(steps=1)
    spec["agents"][0]["tasks"][0] = {"name": "work", "steps": list(steps), **task}
    run = services.run_create(organization=factories.org(), plan=spec)
    run_start(run_id=run.pk)
    assert control.pick_up(run.pk)
    return Run.objects.get(pk=run.pk)


def serve(run: Run) -> int:
    return executor.serve(
        str(run.pk), run.priority, worker="worker:test", task_id="bell-1", hard_limits=False
    )


def statuses(run: Run) -> dict[str, str]:
    return dict(Step.objects.filter(run=run).values_list("name", "status"))


def test_one_doorbell_serves_a_whole_sequence_without_ringing_again(
    rings: list[dict[str, int]],
) -> None:
    run = started(*(step(f"s{i}") for i in range(5)))

    assert serve(run) == 5

    assert Run.objects.get(pk=run.pk).status == "completed"
    assert set(statuses(run).values()) == {"completed"}
    assert set(Step.objects.filter(run=run).values_list("celery_task_id", flat=True)) == {"bell-1"}
    assert rings == []  # nothing was left to serve


def test_a_spent_burst_rings_again_for_the_rest(
    settings: SettingsWrapper, rings: list[dict[str, int]]
) -> None:
    settings.ENGINE_BURST_STEPS = 2
    run = started(*(step(f"s{i}") for i in range(5)))

    assert serve(run) == 2

    assert statuses(run) == {
        "s0": "completed",
        "s1": "completed",
        "s2": "pending",
        "s3": "pending",
        "s4": "pending",
    }
    assert rings == [{str(run.pk): run.priority}]  # at the back of the queue


def test_a_parallel_task_is_served_in_plan_order_within_its_concurrency_limit(
    rings: list[dict[str, int]],
) -> None:
    run = started(*(step(f"s{i}") for i in range(6)), mode="parallel", max_concurrent_steps=2)

    assert serve(run) == 6

    started_order = list(
        Step.objects.filter(run=run).order_by("started_at", "id").values_list("name", flat=True)
    )
    assert started_order == [f"s{i}" for i in range(6)]
    assert Run.objects.get(pk=run.pk).status == "completed"


def test_each_step_has_its_own_soft_time_limit_and_the_timer_is_disarmed_after(
    settings: SettingsWrapper, rings: list[dict[str, int]]
) -> None:
    settings.ENGINE_BURST_SECONDS = 60  # the slow step alone would spend the default
    slow = step("slow", "sleep", params={"seconds": 30}, timeout="1s", retry={"max_attempts": 1})
    run = started(slow, step("next"), failure_mode="continue")
    handler = signal.getsignal(signal.SIGALRM)
    began = time.monotonic()

    assert serve(run) == 2

    assert time.monotonic() - began < 20  # interrupted at its 1 s, not after 30
    steps = {s.name: s for s in Step.objects.filter(run=run)}
    assert steps["slow"].status == "skipped"  # failed, and its task goes on (continue)
    assert steps["slow"].error["cause"] == "timeout"
    assert steps["next"].status == "completed"  # the next step ran, under no stale timer
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    assert signal.getsignal(signal.SIGALRM) == handler


def cancels_its_run(run_id: str) -> str:
    services.run_cancel(run_id=run_id, reason="from inside", actor="test")
    return "cancelled"


def test_a_dropped_result_ends_the_doorbell_and_rings_for_the_run(
    settings: SettingsWrapper, rings: list[dict[str, int]]
) -> None:
    # The step is cancelled while it runs: its result is dropped, and the revoke that a
    # cancel sends may be on its way to this very task; it must not go on to another step.
    path = f"{__name__}.cancels_its_run"
    settings.PYTHON_TOOL_ALLOWLIST = [*settings.PYTHON_TOOL_ALLOWLIST, path]
    first = step("first", "python", params={"callable": path, "kwargs": {"run_id": "${run.id}"}})
    run = started(first, step("second"), failure_mode="continue")

    assert serve(run) == 1

    assert statuses(run) == {"first": "cancelled", "second": "cancelled"}
    assert rings == [{str(run.pk): run.priority}]


def first_recording_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    """The database goes away while the next attempt is recorded (once)."""
    failing = iter([OperationalError("server closed the connection unexpectedly")])

    def record_once_failing(*args: Any) -> tuple[bool, hotpath.Next]:
        error = next(failing, None)
        if error is not None:
            raise error
        return record_and_claim(*args)

    monkeypatch.setattr(executor, "record_and_claim", record_once_failing)


def test_a_recording_that_failed_is_replayed_before_the_doorbell_serves_on(
    rings: list[dict[str, int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The database went away while the first step was being recorded: the task keeps the
    # outcome (RecordFailed.replay), and its retry records it without running the tool
    # again, then serves the rest of the run.
    run = started(step("first"), step("second"))
    first_recording_fails(monkeypatch)
    with pytest.raises(executor.RecordFailed) as failed:
        serve(run)
    assert statuses(run) == {"first": "running", "second": "pending"}

    assert doorbell_task(str(run.pk), run.priority, replay=failed.value.replay) == 1

    assert statuses(run) == {"first": "completed", "second": "completed"}
    assert Run.objects.get(pk=run.pk).status == "completed"
    first = Step.objects.get(run=run, name="first")
    assert first.attempts == 1  # recorded, not run again


def test_a_step_past_its_hard_limit_kills_the_process_it_runs_in() -> None:
    # What Celery's hard time limit does to a pool process, kept by the lease keeper thread
    # for a step served by a doorbell; the pool replaces the process, the sweep the step.
    script = (
        "import django, time; django.setup(); "
        "from orchestrator.lease_keeper import lease_keeper; "
        "lease_keeper.hard_limit(0.2); time.sleep(30)"
    )
    began = time.monotonic()
    child = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        timeout=60,
    )

    assert child.returncode == -signal.SIGKILL
    assert time.monotonic() - began < 30
    assert b"hard time limit" in child.stdout


# --------------------------------------------------------------------------- the transport
Sent = tuple[str, Any, Any]  # task name (or "revoke"), its arguments, its countdown


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch, settings: SettingsWrapper) -> list[Sent]:
    settings.ORCHESTRATOR_DISPATCH_ENABLED = True
    calls: list[Sent] = []

    def send_task(name: str, args: Any = (), **options: Any) -> None:
        calls.append((name, tuple(args), options.get("countdown")))

    monkeypatch.setattr(app, "send_task", send_task)
    monkeypatch.setattr(app.control, "revoke", lambda *a, **k: calls.append(("revoke", a[0], None)))
    # Nothing reaches the queue here, which would look idle to a call for help
    # (tested on its own below).
    monkeypatch.setattr(CeleryTransport, "call_for_help", lambda self, run_id, priority: False)
    return calls


def publish(*messages: StepMessage) -> None:
    with transaction.atomic():
        outbox = Outbox()
        for message in messages:
            outbox.add(message)


def test_ready_steps_ring_a_doorbell_each_up_to_the_limit_per_run(
    sent: list[Sent], settings: SettingsWrapper
) -> None:
    settings.ENGINE_DOORBELLS = 4
    publish(
        *(StepMessage(i, "wide", 5, 30) for i in range(20)),
        *(StepMessage(100 + i, "small", 2, 30) for i in range(2)),
        StepMessage(200, "small", 2, 30, countdown_s=1.5),  # a retry's backoff
    )

    assert sorted(sent) == sorted(
        [(DOORBELL_TASK, ("wide", 5), None)] * 4
        + [(DOORBELL_TASK, ("small", 2), None)] * 2
        + [(EXECUTE_STEP_TASK, (200,), 1.5)]
    )


def test_the_run_a_doorbell_goes_on_serving_needs_one_fewer(
    sent: list[Sent],
) -> None:
    with serving("seq"):
        publish(StepMessage(1, "seq", 5, 30))  # the next step of a sequence: served here
        publish(StepMessage(2, "seq", 5, 30))  # a second publish is not discounted again

    assert sent == [(DOORBELL_TASK, ("seq", 5), None)]


def test_without_doorbells_every_step_has_its_own_message(
    sent: list[Sent], settings: SettingsWrapper
) -> None:
    settings.ENGINE_DOORBELLS = 0
    publish(StepMessage(1, "r", 5, 30), StepMessage(2, "r", 5, 30))

    assert sent == [(EXECUTE_STEP_TASK, (1,), None), (EXECUTE_STEP_TASK, (2,), None)]


def test_a_revoke_rings_again_for_each_run_whose_doorbell_it_may_terminate(
    sent: list[Sent],
) -> None:
    CeleryTransport().revoke(["t1", "t2"], {"r1": 5, "r2": 1})

    assert sent == [
        ("revoke", ["t1", "t2"], None),
        (DOORBELL_TASK, ("r1", 5), None),
        (DOORBELL_TASK, ("r2", 1), None),
    ]


# --------------------------------------------------------------------------- the pick-up
def created(*steps: dict[str, Any], **task: Any) -> Run:
    spec = factories.plan(steps=1)
    spec["agents"][0]["tasks"][0] = {"name": "work", "steps": list(steps), **task}
    run = services.run_create(organization=factories.org(), plan=spec)
    run_start(run_id=run.pk)
    return Run.objects.get(pk=run.pk)


def test_the_pick_up_message_carries_the_priority_and_a_doorbells_limits(
    sent: list[Sent], monkeypatch: pytest.MonkeyPatch, settings: SettingsWrapper
) -> None:
    options: list[dict[str, Any]] = []
    monkeypatch.setattr(app, "send_task", lambda name, **kw: options.append({"name": name, **kw}))

    run = created(step("only"))

    soft, hard = pick_up_limits()
    assert [(o["name"], o["args"], o["soft_time_limit"], o["time_limit"]) for o in options] == [
        (PICK_UP_TASK, (str(run.pk), run.priority), soft, hard)
    ]
    assert soft > settings.CELERY_TASK_SOFT_TIME_LIMIT + settings.ENGINE_BURST_SECONDS


def test_the_pick_up_serves_its_runs_first_steps_itself(sent: list[Sent]) -> None:
    run = created(*(step(f"s{i}") for i in range(3)))
    sent.clear()

    assert pick_up_run_task(str(run.pk), run.priority) is True

    assert Run.objects.get(pk=run.pk).status == "completed"
    assert set(statuses(run).values()) == {"completed"}
    assert sent == []  # no doorbell: the pick-up went on serving the sequence


def test_a_wide_pick_up_rings_one_doorbell_fewer_than_it_needs(
    sent: list[Sent], settings: SettingsWrapper
) -> None:
    settings.ENGINE_DOORBELLS = 8
    run = created(*(step(f"p{i}") for i in range(5)), mode="parallel", max_concurrent_steps=5)
    sent.clear()

    assert pick_up_run_task(str(run.pk), run.priority) is True

    # Five steps ready: four doorbells, the fifth is the pick-up itself (which, alone in
    # this process, then served all five: the doorbells find nothing left).
    assert sent == [(DOORBELL_TASK, (str(run.pk), run.priority), None)] * 4
    assert set(statuses(run).values()) == {"completed"}


def test_a_duplicate_pick_up_serves_nothing(sent: list[Sent]) -> None:
    run = created(step("only"))
    assert pick_up_run_task(str(run.pk), run.priority) is True
    sent.clear()

    assert pick_up_run_task(str(run.pk), run.priority) is False
    assert pick_up_run_task(str(run.pk)) is False  # a message from before the priority

    assert sent == []


def test_a_recording_that_failed_after_the_pick_up_is_replayed_by_a_doorbell(
    sent: list[Sent], monkeypatch: pytest.MonkeyPatch
) -> None:
    run = created(step("first"), step("second"))
    sent.clear()
    first_recording_fails(monkeypatch)
    options: list[dict[str, Any]] = []
    monkeypatch.setattr(app, "send_task", lambda name, **kw: options.append({"name": name, **kw}))

    # The pick-up is committed and done; the outcome is handed to a doorbell.
    assert pick_up_run_task(str(run.pk), run.priority) is True
    assert statuses(run) == {"first": "running", "second": "pending"}
    [bell] = options
    assert (bell["name"], bell["args"], bell["countdown"]) == (
        DOORBELL_TASK,
        (str(run.pk), run.priority),
        1,
    )

    assert doorbell_task(*bell["args"], **bell["kwargs"]) == 1

    assert statuses(run) == {"first": "completed", "second": "completed"}
    assert Step.objects.get(run=run, name="first").attempts == 1  # recorded, not run again
