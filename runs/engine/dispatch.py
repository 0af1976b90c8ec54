"""Dispatch: which children are ready to start, within each parent's concurrency limit.

The rule is the database's (``runs.agents_dispatch``, ``runs.tasks_dispatch``,
``runs.steps_dispatch``, each level's free places by ``runs.free_places``): agents
and tasks become RUNNING in the caller's transaction, steps are marked dispatched, and
here their messages are put in the outbox (published after commit). An approval step is
never sent to a worker: it waits for a decision (``runs.people.approvals``)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import F
from django.db.models.functions import Now
from django.utils import timezone

from common import eventstreams
from runs.models import Agent, Run, Step, Task
from runs.outbox import Outbox, StepMessage, asleep
from runs.states import RunStatus, StepStatus
from runs.transitions import transition


def rearm(step_id: int) -> float | None:
    """A step parked until later (a timer, a rate limit's line, a backoff) whose message
    came ahead of it (a reservation moved later meanwhile, a countdown that fired a moment
    early, a wake-up sent by an earlier version): its message again, for the time it has
    left as its row says now, or, beyond the step-message horizon, asleep for the wake
    sweep. The seconds left, or None for a step no longer pending (a harmless duplicate:
    another message or a claim got there first)."""
    with transaction.atomic():
        step = (
            Step.objects.select_for_update(no_key=True, of=("self",))
            .filter(pk=step_id, status=StepStatus.PENDING, dispatched_at__isnull=False)
            .annotate(left=F("next_run_at") - Now(), priority=F("run__priority"))
            .only("pk", "run_id", "timeout_ms")
            .first()
        )
        if step is None:
            return None
        # A message for now would ring a doorbell: the claim is the step's own.
        left = step.left.total_seconds() if step.left is not None else 0.0
        wait_s = max(left, 0.001)
        if asleep(wait_s):
            Step.objects.filter(pk=step.pk).update(asleep=True)
        priority: int = step.priority
        Outbox().add(StepMessage(step.pk, str(step.run_id), priority, step.timeout_s, wait_s))
        return wait_s


def wake_asleep(now: datetime | None = None) -> int:
    """The wake sweep: send the messages of the steps asleep (parked beyond the
    step-message horizon, ``runs.outbox.asleep``) whose time comes within it, each with
    the countdown to its ``next_run_at`` (due already, a late sweep's: at once), and mark
    them awake; return how many. Beat sends it when the first comes within the horizon
    (``asleep_next_due``), so no step's message waits in the broker longer than the
    horizon, and none is sent before it is needed.

    Idempotent and batched: ENGINE_SWEEP_BATCH steps a transaction, their rows locked
    and skipped when locked (a claim, a park, another sweep at them): two sweeps at once
    send each step once, and a step sent is no longer asleep. A step of a run that is not
    RUNNING (paused, escalated) stays asleep: the run's resume sends it again. A message
    that still comes early (the sweep's clock ahead of the database's) is re-armed by the
    executor; the claim lets no step through before its time."""
    now = now or timezone.now()
    horizon = now + timedelta(seconds=settings.RATE_LIMIT_MAX_COUNTDOWN_S)
    sent = 0
    while True:
        with transaction.atomic():
            due = list(
                Step.objects.select_for_update(no_key=True, skip_locked=True, of=("self",))
                .filter(
                    asleep=True,
                    status=StepStatus.PENDING,
                    next_run_at__lte=horizon,
                    run__status=RunStatus.RUNNING,
                )
                .annotate(priority=F("run__priority"))
                .only("pk", "run_id", "timeout_ms", "next_run_at")
                .order_by("next_run_at")[: settings.ENGINE_SWEEP_BATCH]
            )
            Step.objects.filter(pk__in=[step.pk for step in due]).update(asleep=False)
            outbox = Outbox()
            for step in due:
                assert step.next_run_at is not None  # selected by it
                wait_s = max((step.next_run_at - now).total_seconds(), 0.0)
                outbox.add(
                    StepMessage(step.pk, str(step.run_id), step.priority, step.timeout_s, wait_s)
                )
        sent += len(due)
        if len(due) < settings.ENGINE_SWEEP_BATCH:
            return sent


def asleep_next_due() -> datetime | None:
    """When the wake sweep next has a step to send: the horizon before the earliest
    asleep step's time (beat sends the sweep then)."""
    first = (
        Step.objects.filter(asleep=True, status=StepStatus.PENDING, run__status=RunStatus.RUNNING)
        .order_by("next_run_at")
        .values_list("next_run_at", flat=True)
        .first()
    )
    if first is None:
        return None
    return first - timedelta(seconds=settings.RATE_LIMIT_MAX_COUNTDOWN_S)


def step_from_row(values: dict[str, Any]) -> Step:
    """A Step built from raw columns (the rest deferred), as Django would load it."""
    names = [f.attname for f in Step._meta.concrete_fields if f.attname in values]
    return Step.from_db("default", names, [values[name] for name in names])


# Each level's dispatch, in the database (runs/sql/*_dispatch.sql): its ready
# children started within its free places (runs.free_places), down to their steps.
_DISPATCH_SQL: dict[type[Run | Agent | Task], str] = {
    Run: "SELECT * FROM runs.agents_dispatch(%s, %s)",
    Agent: "SELECT * FROM runs.tasks_dispatch(%s, %s)",
    Task: "SELECT * FROM runs.steps_dispatch(%s, %s)",
}
# The columns of a step dispatched, as ``step_from_row`` takes them.
DISPATCHED = ("id", "tool", "timeout_ms", "run_id", "attempt_number", "status")


def dispatch(run: Run, parent: Run | Agent | Task, outbox: Outbox) -> None:
    """The parent's ready children started, within its concurrency limit, and theirs
    below them down to the steps (one call of the level's function), for a parent and a
    run both RUNNING; the steps dispatched announced (``announce``)."""
    now = timezone.now()
    with connection.cursor() as cursor:
        cursor.execute(_DISPATCH_SQL[type(parent)], [parent.pk, now])
        rows = cursor.fetchall()
    eventstreams.events_written(run.pk)  # the function's events bypass runs.transitions
    announce(run, [step_from_row(dict(zip(DISPATCHED, row, strict=True))) for row in rows], outbox)


def place_freed(run_id: Any, task_id: int) -> None:
    """A step of the task parked (on a timer, in a rate limit's line) and gave its place
    back (``runs.admission.step_admission``): the task's next ready steps take it, in the park's
    transaction (which holds the run's gate shared and the task's row)."""
    run = Run.objects.only("pk", "status", "priority", "waiting_approvals").get(pk=run_id)
    dispatch(run, Task(pk=task_id), Outbox())


def announce(run: Run, ready: list[Step], outbox: Outbox) -> None:
    """Steps just dispatched (and counted in their task): an approval step waits for a
    decision (moved to WAITING_APPROVAL by the dispatch: the run may wait now), every
    other step gets its message."""
    approvals = sum(1 for step in ready if step.status == StepStatus.WAITING_APPROVAL)
    announce_steps(
        str(run.pk),
        run.priority,
        [step for step in ready if step.status != StepStatus.WAITING_APPROVAL],
        outbox,
    )
    if approvals:
        run.waiting_approvals += approvals
        update_waiting_state(run)


def announce_steps(run_id: str, priority: int, ready: list[Step], outbox: Outbox) -> None:
    """Steps just marked dispatched, none of them an approval (the hot path's): each
    gets its message (``announce`` without the approvals' part)."""
    for step in ready:
        outbox.add(StepMessage(step.pk, run_id, priority, step.timeout_s))


def update_waiting_state(run: Run) -> None:
    """RUNNING <-> WAITING_APPROVAL: the run waits when approvals are all it waits for."""
    if run.waiting_approvals <= 0:
        return
    # Read the status afresh: a failure earlier in this transaction may have ended the run.
    if Run.objects.values_list("status", flat=True).get(pk=run.pk) != RunStatus.RUNNING:
        return

    in_flight = Step.objects.filter(
        run=run,
        attempt_number=run.attempt_number,
        status__in=[StepStatus.RUNNING, StepStatus.PENDING],
        dispatched_at__isnull=False,
    ).exists()
    if not in_flight:
        updated = transition(
            Run, run.pk, RunStatus.WAITING_APPROVAL, message="waiting for approval"
        )
        run.status = updated.obj.status


def dispatch_children(run: Run, parent: Run | Agent | Task, outbox: Outbox) -> None:
    """``dispatch``, and for a task the run's waiting state looked at again (RUNNING <->
    WAITING_APPROVAL: a task's step may have been what the run was waiting on)."""
    dispatch(run, parent, outbox)
    if isinstance(parent, Task):
        update_waiting_state(run)
