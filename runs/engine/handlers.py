"""on_error handlers: a failed step's handlers run in sequence; when the last completes,
the failure is handled, and when one fails, the original failure propagates."""

from __future__ import annotations

from django.db.models import F
from django.utils import timezone

from runs.engine.dispatch import dispatch_steps, step_timeout_s
from runs.engine.failure import Failure, child_failed
from runs.engine.propagation import child_done
from runs.materialize import step_row, wiring
from runs.models import EventKind, Mode, Run, Step, Task
from runs.outbox import Outbox, StepMessage
from runs.plan import HandlerPlan
from runs.states import RunStatus, StepStatus
from runs.transitions import record_event, transition_many


def handler_finished(run: Run, task: Task, handler: Step, outbox: Outbox) -> None:
    """An on_error handler ended: the original failure is handled, or it propagates."""
    Task.objects.filter(pk=task.pk).update(
        open_children=F("open_children") - 1, active_children=F("active_children") - 1
    )
    task.open_children -= 1
    task.active_children -= 1
    original = Step.objects.get(pk=handler.handler_for_id or 0)
    if handler.status == StepStatus.COMPLETED:
        if handler.dependents:
            Step.objects.filter(handler_for=original, name__in=handler.dependents).update(
                pending_dependencies=F("pending_dependencies") - 1
            )
            dispatch_steps(run, task, outbox)
            return
        Step.objects.filter(pk=original.pk).update(handled=True)
        original.handled = True
        record_event(
            run,
            EventKind.ERROR,
            entity="step",
            entity_id=str(original.pk),
            message=f"failure of {original.name} handled by on_error",
        )
        child_done(run, task, original, success=True, was_dispatched=True, outbox=outbox)
        return
    transition_many(
        Step,
        Step.objects.filter(handler_for=original),
        StepStatus.SKIPPED,
        from_states=[StepStatus.PENDING],
        message="an earlier on_error handler failed",
    )
    left = Step.objects.filter(
        handler_for=original, status=StepStatus.SKIPPED, dispatched_at__isnull=True
    ).count()
    if left:
        Task.objects.filter(pk=task.pk).update(open_children=F("open_children") - left)
        task.open_children -= left
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
    names = [handler["name"] for handler in step.on_error]
    wired = wiring(Mode.SEQUENTIAL, names, [[] for _ in names])
    first_position = step.position * 1000 + 1_000_000  # after every planned step
    rows = []
    for index, spec in enumerate(step.on_error):
        handler = step_row(
            run,
            task,
            HandlerPlan.from_stored(spec, name=f"{step.name}.on_error.{spec['name']}"),
            first_position + index,
            (wired[index][0], [f"{step.name}.on_error.{n}" for n in wired[index][1]]),
            step.generation,
        )
        handler.handler_for = step
        rows.append(handler)
    Step.objects.bulk_create(rows)
    Task.objects.filter(pk=task.pk).update(
        step_count=F("step_count") + len(rows), open_children=F("open_children") + len(rows)
    )
    task.open_children += len(rows)
    first = rows[0]
    Step.objects.filter(pk=first.pk).update(dispatched_at=timezone.now())
    Task.objects.filter(pk=task.pk).update(active_children=F("active_children") + 1)
    task.active_children += 1
    outbox.add(StepMessage(first.pk, str(run.pk), run.priority, step_timeout_s(first)))
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
    if first is None or first.status != StepStatus.PENDING or first.pending_dependencies == 0:
        return 0
    Step.objects.filter(pk=first.pk).update(pending_dependencies=F("pending_dependencies") - 1)
    if run.status == RunStatus.RUNNING:
        dispatch_steps(run, Task.objects.get(pk=step.task_id), outbox)
    return 1
