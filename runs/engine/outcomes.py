"""A step attempt's outcome, recorded: charged, then completed, retried or failed, and the
run moved on, in one transaction under the run's lock."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from billing.pricing import tool_price
from billing.services import BudgetExhausted, credits_charge
from common import eventstreams
from common.tools.base import ToolError
from runs import services
from runs.admission import run_admission
from runs.engine import hotpath, policy
from runs.engine.dispatch import announce_steps, step_from_row, update_waiting_state
from runs.engine.failure import Failure, child_failed, end_child
from runs.engine.handlers import handler_finished, start_handlers
from runs.engine.propagation import child_done
from runs.engine.retry import decide
from runs.engine.waiting import WaitRefused, park
from runs.models import EscalationReason, EventKind, Run, Step, Task
from runs.outbox import Outbox, RunMessage, StepMessage, asleep, enqueue_run_message
from runs.states import RunStatus, StepStatus
from runs.transitions import record_event, transition_locked


@dataclass(frozen=True)
class Outcome:
    output: Any = None
    cost: Decimal = Decimal(0)
    error: ToolError | None = None
    skipped: bool = False
    # The attempt goes on outside the worker (runs.engine.waiting): park the step.
    wait: dict[str, Any] | None = None
    # The output is another step's, the tool did not run (runs.reuse): the step's
    # `reused_from` or `cached_from`, as one key of a dict.
    borrowed: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "output": self.output,
            "cost": str(self.cost),
            "error": self.error.as_dict() if self.error else None,
            "skipped": self.skipped,
            "wait": self.wait,
            "borrowed": self.borrowed,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Outcome:
        error = data.get("error")
        return cls(
            output=data.get("output"),
            cost=Decimal(data.get("cost", "0")),
            error=ToolError(error["code"], error["message"], error["retryable"]) if error else None,
            skipped=bool(data.get("skipped")),
            wait=data.get("wait"),
            borrowed=data.get("borrowed"),
        )


def step_finished(run: Run, step: Step, outbox: Outbox) -> None:
    """A step reached a terminal state: count it, release its dependents, finish its task."""
    if step.handler_for_id is not None:
        handler_finished(run, Task.objects.get(pk=step.task_id), step, outbox)
        return
    child_done(run, step, outbox)


def charge_step(run: Run, step: Step, cost: Decimal) -> Failure | None:
    """Charge a finished step attempt on its run attempt's reservation; a charge beyond
    it is a failure. Once: the caller holds the step's row, found RUNNING this attempt,
    and moves it out of RUNNING in the same transaction."""
    try:
        # Identified by run and number: no need to read the attempt row first.
        credits_charge(run_id=run.pk, attempt_number=step.attempt_number, amount=cost)
    except BudgetExhausted as exc:
        return Failure("budget_exhausted", str(exc))
    return None


def step_failed(run: Run, step: Step, failure: Failure, outbox: Outbox) -> None:
    """A running step failed for good (retries exhausted or not retryable).

    With on_error handlers it ends FAILED while they run; otherwise its task reacts by
    its failure mode (``child_failed``). A failing handler settles its original step.
    """
    task = Task.objects.get(pk=step.task_id)
    if step.handler_for_id is not None:
        end_child(step, "failed", failure)
        handler_finished(run, task, step, outbox)
    elif step.on_error:
        end_child(step, "failed", failure)
        start_handlers(run, task, step, outbox)
    else:
        child_failed(run, task, step, failure, outbox)


def record(step_id: int, run_id: Any, attempt: int, outcome: Outcome) -> bool:
    """Record the attempt and advance the run (``record_and_claim`` without a claim)."""
    return record_and_claim(step_id, run_id, attempt, outcome)[0]


def record_and_claim(
    step_id: int, run_id: Any, attempt: int, outcome: Outcome, claim: hotpath.Claim | None = None
) -> tuple[bool, hotpath.Next]:
    """Record the attempt and advance the run, under the run's gate or lock.

    The plainest outcome (completed, nothing above its agent changes) is recorded by one
    call of the hot path's function inside PostgreSQL (``hotpath.complete``), which may
    also claim the run's next step for the worker (``claim``); anything else, or what
    the function declines, by the general path in one transaction under the run's lock.

    Returns whether it was applied (False: the result was dropped, the step no longer
    runs this attempt: cancelled, failed by a sweep or reclaimed meanwhile) and what was
    claimed and chosen for the worker (``hotpath.Next``: nothing on the general path)."""
    claimed = hotpath.Next()
    # A borrowed output says so on its step and in an event: the general path writes it.
    if (
        outcome.wait is None
        and outcome.borrowed is None
        and hotpath.eligible(outcome.error, outcome.skipped, outcome.cost)
    ):
        done, claimed = hotpath.complete(
            run_id, step_id, attempt, output=outcome.output, cost=outcome.cost, claim=claim
        )
        # The function's events bypass runs.transitions: their live streams are told here
        # (a set lookup for a run nobody streams; docs/api.md, "A run's event stream").
        if claimed.claimed is not None:
            eventstreams.events_written(claimed.claimed["run_id"])
        if done is not None:
            eventstreams.events_written(run_id)
            _announce(run_id, done)
            return True, claimed
    with transaction.atomic():
        run = services.lock_run(run_id, light=True)
        # Anything else, or the hot path wrote nothing (a charge beyond the reservation
        # included: here it fails the step with budget_exhausted).
        return _record(run, step_id, attempt, outcome, timezone.now()), claimed


def _announce(run_id: Any, done: hotpath.Completed) -> None:
    """What the hot path's commit asks for: the steps it dispatched published; when it
    ended the run, what ``services.run_complete`` does beyond its writes (a child's
    parent told, ``runs.waits.children``; the runs of the organization waiting for its place
    looked at again, ``runs.admission.run_admission``)."""
    if done.dispatched:
        ready = [step_from_row(row) for row in done.dispatched]
        announce_steps(str(run_id), done.priority, ready, Outbox())
    if done.run_finished:
        run = Run.objects.only("organization_id", "priority", "parent_run_id").get(pk=run_id)
        if run.parent_run_id is not None:
            enqueue_run_message(RunMessage.CHILD_ENDED, run.pk, run.priority)
        run_admission.released(run)


_FINISH_SQL = "SELECT runs.step_finish(%s, %s, %s, %s, %s, %s, %s, %s)"


def _finish(run: Run, step: Step, attempt: int, outcome: Outcome, now: datetime) -> Step:
    """The step completes, as the hot path completes one (``runs.step_finish``: its
    event kept on its row), with the output it borrowed, if any; ``step`` is returned
    as it now is."""
    borrowed = outcome.borrowed or {}
    with connection.cursor() as cursor:
        cursor.execute(
            _FINISH_SQL,
            [
                step.pk,
                attempt,
                # None is SQL NULL, as the ORM stores it, not a JSON null.
                None if outcome.output is None else json.dumps(outcome.output),
                outcome.cost,
                str(outcome.cost),
                now,
                _json(borrowed.get("reused_from")),
                _json(borrowed.get("cached_from")),
            ],
        )
    eventstreams.events_written(run.pk)  # the function's event bypasses runs.transitions
    step.status = StepStatus.COMPLETED
    step.output, step.cost, step.lease_expires_at = outcome.output, step.cost + outcome.cost, None
    step.status_changed_at = step.completed_at = now
    for name, value in borrowed.items():
        setattr(step, name, value)
    step.__dict__.pop("duration_ms", None)  # the database's rule wrote it: read on demand
    return step


def _json(value: Any) -> str | None:
    return None if value is None else json.dumps(value)


def _borrowed_message(borrowed: dict[str, Any]) -> str:
    if "reused_from" in borrowed:
        source = borrowed["reused_from"]
        return f"reused the output of step {source['step']} (attempt {source['attempt']})"
    if "cached_from" in borrowed:
        source = borrowed["cached_from"]
        return f"cached: the output of step {source['step']} of run {source['run']}"
    return ""


def _record(run: Run, step_id: int, attempt: int, outcome: Outcome, now: datetime) -> bool:
    """The general path: every outcome, at every level."""
    step = (
        Step.objects.select_for_update(no_key=True)
        .filter(pk=step_id, status=StepStatus.RUNNING, attempts=attempt)
        .defer("params", "output", "on_error", "on_callback", "when")
        .first()
    )
    if step is None:
        return False  # cancelled, failed by a sweep or reclaimed meanwhile: result dropped
    outbox = Outbox()
    with connection.cursor() as cursor:  # when due, as every recording beats
        cursor.execute("SELECT runs.run_heartbeat(%s, %s, %s)", [run.pk, run.last_heartbeat, now])
    if outcome.wait is not None:
        try:
            output = park(run, step, outcome.wait, now)
        except WaitRefused as refused:
            outcome = Outcome(error=ToolError(refused.code, refused.message, False))
        else:
            if output is None:
                return True  # the step waits
            # Handed on and done with (a child run started asynchronously).
            outcome = Outcome(output=output, cost=tool_price(step.tool))
    if outcome.skipped:
        transition_locked(
            step,
            StepStatus.SKIPPED,
            message="condition is false",
            updates={"lease_expires_at": None},
            now=now,
        )
        step.status = StepStatus.SKIPPED
        step_finished(run, step, outbox)
        return True
    failure = charge_step(run, step, outcome.cost) if outcome.cost else None
    if outcome.error is None and failure is None:
        borrowed = outcome.borrowed or {}
        done = _finish(run, step, attempt, outcome, now)
        if borrowed:
            record_event(
                run,
                EventKind.REUSE,
                actor="engine",
                message=_borrowed_message(borrowed),
                payload=borrowed,
                entity="step",
                entity_id=str(step.pk),
            )
        step_finished(run, done, outbox)
        update_waiting_state(run)
        return True

    error = outcome.error or ToolError(failure.code, failure.message, False)  # type: ignore[union-attr]
    if failure is not None:
        error = ToolError(failure.code, failure.message, False)
    failures = step.failures + 1
    decision = decide(
        step.retry,
        code=error.code,
        retryable=error.retryable,
        attempts=attempt - step.retry_base_attempts,
        failures=failures - step.retry_base_failures,
    )
    charged = outcome.cost if failure is None else Decimal(0)
    Step.objects.filter(pk=step.pk).update(
        failures=failures, error=error.as_dict(), cost=step.cost + charged
    )
    step.failures, step.error, step.cost = failures, error.as_dict(), step.cost + charged
    policy.record_failure(run, step, attempt, error, now)
    reason = policy.escalation_for(
        run,
        retry=decision.retry,
        escalate=decision.escalate,
        retryable=error.retryable,
        now=now,
    )
    if reason:
        # People decide: the step waits, the run escalates (runs.engine.policy). A burst
        # or a rate keeps the retry's backoff for when it resumes; a spent budget or a
        # backoff beyond its cap is due at once then (its budget starts afresh).
        window = reason in (EscalationReason.ERROR_BURST, EscalationReason.ERROR_RATE)
        policy.hold_for_escalation(
            run, step, attempt, error, reason, delay_ms=decision.delay_ms if window else 0, now=now
        )
        return True
    if run.status == RunStatus.ESCALATED:
        policy.note_failure(run, step, attempt, error, now)
    if decision.retry:
        due = now + timedelta(milliseconds=decision.delay_ms)
        transition_locked(
            step,
            StepStatus.PENDING,
            message=f"retry in {decision.delay_ms} ms after {error.code}",
            payload={**error.as_dict(), "delay_ms": decision.delay_ms, "attempt": attempt},
            updates={
                "next_run_at": due,
                "lease_expires_at": None,
                "asleep": asleep(decision.delay_ms / 1000),
            },
            now=now,
        )
        outbox.add(
            StepMessage(
                step.pk, str(run.pk), run.priority, step.timeout_s, decision.delay_ms / 1000
            )
        )
        return True
    message = (
        error.message
        if decision.code == error.code
        else f"{decision.code} after {error.code}: {error.message}"
    )
    step.error = {
        **error.as_dict(),
        "code": decision.code,
        "message": message,
        "cause": error.code,
    }
    Step.objects.filter(pk=step.pk).update(error=step.error, lease_expires_at=None)
    step_failed(run, step, Failure(decision.code, message), outbox)
    return True
