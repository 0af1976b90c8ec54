"""on_error handlers: a failed step's handlers run in sequence; when the last completes,
the failure is handled, and when one fails, the original failure propagates."""

from __future__ import annotations

from django.db.models import F
from django.utils import timezone

from runs.engine.dispatch import dispatch
from runs.engine.failure import Failure, child_failed
from runs.engine.propagation import child_done
from runs.materialize import add_handler_rows
from runs.models import EventKind, Run, Step, Task
from runs.outbox import Outbox, StepMessage
from runs.states import RunStatus, StepStatus
from runs.transitions import record_event


def handler_finished(run: Run, task: Task, handler: Step, outbox: Outbox) -> None:
    """An on_error handler ended (counted off in its task, its successors released or
    skipped: ``runs.child_done``): the original failure is handled once the last
    completes, and propagates when one fails."""
    child_done(run, handler, outbox)
    original = Step.objects.get(pk=handler.handler_for_id or 0)
    if handler.status == StepStatus.COMPLETED:
        if handler.dependents:
            return  # the next handler in the chain runs
        Step.objects.filter(pk=original.pk).update(handled=True)
        original.handled = True
        record_event(
            run,
            EventKind.ERROR,
            entity="step",
            entity_id=str(original.pk),
            message=f"failure of {original.name} handled by on_error",
        )
        child_done(run, original, outbox)
        return
    error = original.error or {}
    child_failed(
        run,
        task,
        original,
        Failure(error.get("code", "tool_error"), error.get("message", "step failed")),
        outbox,
    )


def start_handlers(run: Run, task: Task, step: Step, outbox: Outbox) -> bool:
    """Create and dispatch the failed step's on_error handlers; False if it has none."""
    if not step.on_error or step.handler_for_id is not None:
        return False
    first_position = step.position * 1000 + 1_000_000  # after every planned step
    rows = add_handler_rows(run, task, step, "on_error", first_position)
    first = rows[0]
    Step.objects.filter(pk=first.pk).update(dispatched_at=timezone.now())
    Task.objects.filter(pk=task.pk).update(active_children=F("active_children") + 1)
    task.active_children += 1
    outbox.add(StepMessage(first.pk, str(run.pk), run.priority, first.timeout_s))
    record_event(
        run,
        EventKind.ERROR,
        entity="step",
        entity_id=str(step.pk),
        message=f"running {len(rows)} on_error handler(s) for {step.name}",
    )
    return True


def release_callback_handlers(run: Run, step_id: int, outbox: Outbox) -> int:
    """The child run of an async_callback step ended: its first on_callback handler,
    held by that end, becomes ready (the rest follow it in sequence). How many were
    released: 0 when they had ended already (the run failed or was cancelled since)."""
    step = Step.objects.only("task_id", "generation").get(pk=step_id)
    first = (
        Step.objects.filter(
            task_id=step.task_id, generation=step.generation, callback_for_id=step_id
        )
        .order_by("position")
        .only("pk", "status", "pending_dependencies")
        .first()
    )
    # PAUSED: the run is paused (resume dispatches it once it is ready).
    waiting = (StepStatus.PENDING, StepStatus.PAUSED)
    if first is None or first.status not in waiting or first.pending_dependencies == 0:
        return 0
    Step.objects.filter(pk=first.pk).update(pending_dependencies=F("pending_dependencies") - 1)
    if run.status == RunStatus.RUNNING:
        dispatch(run, Task(pk=step.task_id), outbox)
    return 1
