"""Child runs: a `run` step starts a run of its own plan in the same organization
(docs/runners.md, "Child runs").

The child is created and started by the recording of the step's attempt
(``runs.engine.waiting``), in the parent's transaction, with its own reservation. When
it ends, by any path, its last transaction publishes ``RunMessage.CHILD_ENDED`` after
commit, and ``child_ended`` here tells the parent, once (``Run.parent_notified_at``):

- sync: the step completes with ``{child_run, status, outputs}``, or fails with
  ``child_failed`` / ``child_cancelled``;
- async_callback: the step's on_callback handlers, held until now, start;
- async_poll: nothing waits; the end is only recorded.

A lost message is made good by the wait sweep (``runs.waits.callbacks.sweep``). The lock order
is parent before child everywhere: a cancel cascades down within one transaction, and
an end travels up only after the child's transaction committed.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone

from billing.pricing import tool_price
from common import tracing
from common.tools.base import ToolError
from runs.engine.handlers import release_callback_handlers
from runs.engine.outcomes import Outcome, record
from runs.models import EventKind, Run, Step
from runs.outbox import Outbox
from runs.selectors import run_outputs
from runs.services import lock_run
from runs.states import RUN_TERMINAL, RunStatus
from runs.transitions import record_event


def child_summary(child: Run) -> dict[str, Any]:
    """How a child run ended, as its parent reads it (``${callback.*}``, a sync step's
    output)."""
    outputs = run_outputs(child)
    summary = {
        "child_run": str(child.pk),
        "status": child.status,
        "outputs": outputs.values,
        "error": child.last_error,
    }
    if outputs.truncated:
        summary["outputs_truncated"] = True
    return summary


def child_ended(child_id: Any) -> bool:
    """Tell the parent that ``child_id`` ended; False when there is nothing to tell (not
    a child, not ended, or told already)."""
    with transaction.atomic():
        parent_id = Run.objects.filter(pk=child_id).values_list("parent_run_id", flat=True).first()
        if parent_id is None:
            return False
        parent = lock_run(parent_id, light=True)
        child = Run.objects.select_for_update(no_key=True).get(pk=child_id)
        if child.status not in RUN_TERMINAL or child.parent_notified_at is not None:
            return False
        now = timezone.now()
        Run.objects.filter(pk=child.pk).update(parent_notified_at=now)
        child.parent_notified_at = now
        summary = child_summary(child)
        record_event(
            parent,
            EventKind.CHILD,
            message=f"child run {child.pk} ended {child.status}",
            payload={"child_run": str(child.pk), "status": child.status, "mode": child.parent_mode},
            entity="step",
            entity_id=str(child.parent_step_id or ""),
        )
        if child.parent_step_id is None or child.parent_step_attempt is None:
            return True
        if tracing.enabled:
            _trace_wait(child)
        if child.parent_mode == "sync":
            record(child.parent_step_id, parent.pk, child.parent_step_attempt, _outcome(summary))
        elif child.parent_mode == "async_callback":
            release_callback_handlers(parent, child.parent_step_id, Outbox())
        return True


def _trace_wait(child: Run) -> None:
    assert child.parent_step_id is not None  # a child run's, told to its parent step
    """The parent step's wait for its child, a span under the step's attempt from the
    child's creation to its end, linked to the child's own trace (emitted at commit)."""
    stored = Step.objects.filter(pk=child.parent_step_id).values_list("trace_context", flat=True)
    parent_context = stored.first() or ""
    ended = child.completed_at or child.cancelled_at or timezone.now()
    attributes = {
        "orchestrator.run.id": str(child.parent_run_id),
        "orchestrator.step.id": child.parent_step_id,
        "orchestrator.wait.kind": "child_run",
        "orchestrator.child_run.id": str(child.pk),
        "orchestrator.child_run.status": child.status,
        "orchestrator.child_run.mode": child.parent_mode,
    }
    links = tracing.link(child.trace_context, relation="child run")
    transaction.on_commit(
        lambda: tracing.emit(
            "wait child_run",
            parent_context=parent_context,
            started=child.created_at,
            ended=ended,
            attributes=attributes,
            links=links,
        )
    )


def _outcome(summary: dict[str, Any]) -> Outcome:
    """A sync step's outcome: the child's outputs, or why it did not complete."""
    status = summary["status"]
    if status == RunStatus.COMPLETED:
        kept = ("child_run", "status", "outputs", "outputs_truncated")
        output = {key: summary[key] for key in kept if key in summary}
        return Outcome(output=output, cost=tool_price("run"))
    error = summary["error"] or {}
    message = f"child run {summary['child_run']} {status}: " + str(
        error.get("message") or "no reason given"
    )
    code = "child_cancelled" if status == RunStatus.CANCELLED else "child_failed"
    return Outcome(error=ToolError(code, message, False), cost=tool_price("run"))
