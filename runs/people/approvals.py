"""Approval decisions: approve or reject the steps a run waits on, and move it on.

A decision is a service like the others (one function per operation, called by the API,
the admin and the CLI), but it continues into the engine in the same transaction: the
approved step counts as finished, the rejected one fails by its task's failure mode.
It sits above the engine, which builds on ``runs.services``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.utils import timezone

from billing.models import Organization
from common import tracing
from common.text import storable_text
from runs.engine.failure import Failure
from runs.engine.outcomes import step_failed, step_finished
from runs.models import EventKind, Run, Step
from runs.outbox import Outbox
from runs.services import RunId, StepNotFound, error_payload, lock_run
from runs.states import RunStatus, StepStatus
from runs.transitions import record_event, transition, transition_many


class NothingWaiting(Exception):
    """A decision asked of a run none of whose steps waits for approval (for callers
    that report it; the services themselves treat it as a no-op)."""

    code = "nothing_waiting"


@dataclass(frozen=True)
class ApprovalResult:
    run: Run
    steps: list[Step]

    @property
    def changed(self) -> bool:
        return bool(self.steps)


def _waiting_steps(run: Run, step_id: int | None) -> Any:
    steps = Step.objects.filter(
        run=run, attempt_number=run.attempt_number, status=StepStatus.WAITING_APPROVAL
    )
    if step_id is not None:
        if not Step.objects.filter(run=run, pk=step_id).exists():
            raise StepNotFound(f"step {step_id} is not part of run {run.pk}")
        steps = steps.filter(pk=step_id)
    return steps


def _decide(
    *,
    run_id: RunId,
    step_id: int | None,
    comment: str,
    organization: Organization | None,
    actor: str,
    approve: bool,
) -> ApprovalResult:
    run = lock_run(run_id, organization)
    comment = storable_text(comment.strip()[:2000])
    decision = {"approved": approve, "comment": comment, "by": actor}
    if approve:
        updates: dict[str, Any] = {"output": decision}
        to_status = StepStatus.COMPLETED
    else:
        message = comment or "approval rejected"
        updates = {"error": {**error_payload("approval_rejected", message), "retryable": False}}
        to_status = StepStatus.FAILED
    waiting = _waiting_steps(run, step_id)
    if tracing.enabled:
        _trace_waits(run, waiting, approve)
    steps = transition_many(
        Step,
        waiting,
        to_status,
        from_states=[StepStatus.WAITING_APPROVAL],
        actor=actor,
        message=comment,
        payload=decision,
        updates=updates,
    )
    if steps:
        record_event(
            run,
            EventKind.APPROVAL,
            actor=actor,
            message=comment,
            payload={**decision, "steps": [step.pk for step in steps]},
        )
        if run.status == RunStatus.WAITING_APPROVAL:
            run = transition(Run, run.pk, RunStatus.RUNNING, actor=actor).obj
        run = _continue_after_decision(run, steps, approve)
    return ApprovalResult(run, steps)


def _trace_waits(run: Run, waiting: Any, approve: bool) -> None:
    """Each decided step's wait, a span of the run's trace from the moment it began to
    wait to this decision (emitted once the decision commits)."""
    rows = list(waiting.values_list("pk", "name", "status_changed_at"))
    ended = timezone.now()

    def emit() -> None:
        for step_id, name, since in rows:
            tracing.emit(
                "wait approval",
                parent_context=run.trace_context,
                started=since or ended,
                ended=ended,
                attributes={
                    "orchestrator.run.id": str(run.pk),
                    "orchestrator.step.id": step_id,
                    "orchestrator.step.name": name,
                    "orchestrator.wait.kind": "approval",
                    "orchestrator.wait.outcome": "approved" if approve else "rejected",
                },
                links=tracing.link(tracing.traceparent(), relation="decision"),
            )

    transaction.on_commit(emit)


def _continue_after_decision(run: Run, steps: list[Step], approved: bool) -> Run:
    """Hand the decided steps to the engine, which moves the run on (same transaction)."""
    waiting = Step.objects.filter(
        run=run, attempt_number=run.attempt_number, status=StepStatus.WAITING_APPROVAL
    ).count()
    Run.objects.filter(pk=run.pk).update(waiting_approvals=waiting)
    run.waiting_approvals = waiting
    outbox = Outbox()
    for step in steps:
        # An escalated run counts its decisions too (nothing new starts until it is
        # resolved); one an earlier rejection failed has nothing left to move on.
        if run.status not in (RunStatus.RUNNING, RunStatus.ESCALATED):
            break
        if approved:
            step_finished(run, step, outbox)
        else:
            error = step.error or {}
            failure = Failure(error.get("code", "approval_rejected"), error.get("message", ""))
            step_failed(run, step, failure, outbox)
        run.refresh_from_db()
    return run


@transaction.atomic
def run_approve(
    *,
    run_id: RunId,
    step_id: int | None = None,
    comment: str = "",
    organization: Organization | None = None,
    actor: str = "system",
) -> ApprovalResult:
    """Complete the steps waiting for approval (one, or all). Nothing waiting: no-op."""
    return _decide(
        run_id=run_id,
        step_id=step_id,
        comment=comment,
        organization=organization,
        actor=actor,
        approve=True,
    )


@transaction.atomic
def run_reject(
    *,
    run_id: RunId,
    step_id: int | None = None,
    comment: str = "",
    organization: Organization | None = None,
    actor: str = "system",
) -> ApprovalResult:
    """Fail the steps waiting for approval with `approval_rejected`. Nothing waiting: no-op."""
    return _decide(
        run_id=run_id,
        step_id=step_id,
        comment=comment,
        organization=organization,
        actor=actor,
        approve=False,
    )
