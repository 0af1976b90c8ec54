"""Executing one step attempt: claim, run the tool outside any transaction, record.

1. Claim: one conditional UPDATE moves the step PENDING -> RUNNING (and writes its
   event) only if it is pending, dispatched, due, and its run is RUNNING. A duplicate or
   late delivery, or a message for a paused or cancelled run, claims nothing: a no-op.
2. Run: the `when` condition and `${...}` parameters are resolved (secrets decrypted
   here, on the worker), then the tool runs with no transaction open, its lease renewed
   by the heartbeat thread. The secret values are redacted from what it leaves behind.
3. Record: one transaction, under the run's lock, that records output, cost and state,
   charges the attempt, and advances the run (``orchestrator.engine``). It applies only
   if the step is still running this attempt: a step cancelled or reclaimed meanwhile
   keeps its new state and the late result is dropped.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from typing import Any

from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.db import InterfaceError, OperationalError, connection, transaction
from django.utils import timezone
from psycopg.pq import TransactionStatus

from billing.pricing import tool_price
from common.expressions import ExpressionError, parsed
from common.redaction import redact, redact_text, redactable, redacting
from common.templates import Reference, TemplateError, UnresolvedReference, render_value
from common.text import storable_text, unstorable_string
from common.tools import registry
from common.tools.base import Tool, ToolContext, ToolError
from orchestrator import engine, retry
from orchestrator.context import StepContext
from orchestrator.dispatch import Outbox, StepMessage
from orchestrator.heartbeat import heart
from runs import services
from runs.models import Run, Step
from runs.states import StepStatus
from runs.transitions import claim_step, transition_locked

logger = logging.getLogger(__name__)

MAX_OUTPUT_BYTES = 1_000_000


@dataclass(frozen=True)
class Outcome:
    output: Any = None
    cost: Decimal = Decimal(0)
    error: ToolError | None = None
    skipped: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {
            "output": self.output,
            "cost": str(self.cost),
            "error": self.error.as_dict() if self.error else None,
            "skipped": self.skipped,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Outcome:
        error = data.get("error")
        return cls(
            output=data.get("output"),
            cost=Decimal(data.get("cost", "0")),
            error=ToolError(error["code"], error["message"], error["retryable"]) if error else None,
            skipped=bool(data.get("skipped")),
        )


class RecordFailed(Exception):
    """Recording an attempt hit a transient database error; the outcome is kept so the
    task can retry the recording alone, without running the tool again."""

    def __init__(self, step_id: int, run_id: Any, attempt: int, outcome: Outcome) -> None:
        self.replay = {"run_id": str(run_id), "attempt": attempt, "outcome": outcome.as_dict()}
        super().__init__(f"could not record step {step_id} attempt {attempt}")


def claim(step_id: int, worker: str, task_id: str) -> Step | None:
    """Claim the step; return it (the fields an attempt needs), or None if there is
    nothing to do."""
    values = claim_step(
        step_id, worker=worker, task_id=task_id, lease_seconds=float(settings.ENGINE_LEASE_SECONDS)
    )
    return None if values is None else engine.step_from_row(values)


def execute_step(step_id: int, *, worker: str = "", task_id: str = "") -> str:
    """Run one attempt of ``step_id``; return what happened (for logs and tests)."""
    worker = worker or f"{os.uname().nodename}:{os.getpid()}"
    step = claim(step_id, f"{worker}:{os.getpid()}", task_id)
    if step is None:
        return "not claimed"
    attempt = step.attempts
    outcome = run_attempt(step, attempt)
    discard_interrupted_connection()
    try:
        record(step_id, step.run_id, attempt, outcome)
    except (OperationalError, InterfaceError) as exc:
        raise RecordFailed(step_id, step.run_id, attempt, outcome) from exc
    if outcome.skipped:
        return "skipped"
    return "failed" if outcome.error else "completed"


def discard_interrupted_connection() -> None:
    """Close the database connection if a query on it was interrupted mid-command.

    The soft time limit is a signal that raises SoftTimeLimitExceeded wherever the tool
    is, a query of its cancellation check included. psycopg cancels an interrupted query
    only for KeyboardInterrupt and SystemExit; after any other exception the connection
    stays ACTIVE and the next statement fails ("can't change 'autocommit' now"), which
    lost the recording of a timed-out step (found by make load). The query is cancelled
    on the server (closing alone leaves it running there until it ends) and the
    connection closed; Django opens a fresh one for the recording.
    """
    raw = connection.connection
    # ACTIVE only: INTRANS is an open transaction (a test's), not an interrupted command.
    if raw is None or raw.info.transaction_status != TransactionStatus.ACTIVE:
        return
    try:
        raw.cancel_safe(timeout=5)
    except Exception:  # the server may be gone too; closing is what matters
        logger.warning("could not cancel an interrupted query", exc_info=True)
    connection.close()


def run_attempt(step: Step, attempt: int) -> Outcome:
    """Evaluate the condition, render the parameters and run the tool (no transaction).

    The values of the secrets the parameters resolved are redacted here, once, from the
    outcome (output, error message) before anything records it, and from the log lines
    written while the tool runs (``config.logging.RedactSecrets``). The rendered
    parameters themselves are never stored: the step row keeps the template.
    """
    context = StepContext(step, step.run_id, attempt)
    try:
        if step.when and not parsed(step.when).truthy(_without_secrets(context)):
            return Outcome(skipped=True)
    except (ExpressionError, TemplateError, UnresolvedReference) as exc:
        return Outcome(error=ToolError("condition_error", f"when: {exc}", False))
    try:
        params = render_value(step.params, context)
    except (TemplateError, UnresolvedReference) as exc:
        message = redact_text(str(exc), context.secrets_used.values())
        return Outcome(error=ToolError("template_error", message, False))
    spec = registry.get(step.tool)
    if spec is None or spec.run is None:
        return Outcome(
            error=ToolError("tool_error", f"tool {step.tool!r} cannot run on a worker", False)
        )
    ctx = ToolContext(
        step_id=step.pk,
        run_id=str(step.run_id),
        attempt=attempt,
        timeout_s=engine.step_timeout_s(step),
        stop_requested=lambda: (
            not Step.objects.filter(
                pk=step.pk, status=StepStatus.RUNNING, attempts=attempt
            ).exists()
        ),
    )
    secrets = redactable(context.secrets_used.values())
    heart.begin(step.pk, step.run_id, attempt)
    try:
        with redacting(secrets):
            outcome = _run_tool(spec.run, step, params, ctx)
        return _recordable(outcome, secrets, step.tool)
    except SoftTimeLimitExceeded:  # while a large output was being redacted or checked
        return _timed_out(step)
    finally:
        heart.end()


def _without_secrets(context: StepContext) -> Callable[[Reference], Any]:
    """The resolver of `when` conditions: runs/spec.py refuses secrets there, and this
    keeps a value out of a condition's error message even for a plan it did not check."""

    def resolve(ref: Reference) -> Any:
        if ref[0] == "secrets":
            raise UnresolvedReference("secrets cannot be used in conditions", ref)
        return context(ref)

    return resolve


def _run_tool(tool: Tool, step: Step, params: dict[str, Any], ctx: ToolContext) -> Outcome:
    """Call the tool; whatever it raises becomes the outcome's error (not yet redacted)."""
    try:
        result = tool(params, ctx)
        cost = tool_price(step.tool) if result.cost is None else result.cost
        return Outcome(output=result.output, cost=cost)
    except ToolError as exc:
        return Outcome(error=exc, cost=tool_price(step.tool))
    except SoftTimeLimitExceeded:
        return _timed_out(step)
    except (OperationalError, InterfaceError):
        # The database went away under the tool (its cancellation check, a template's
        # query): not the tool's failure. The attempt is abandoned; its lease expires
        # and the sweep runs it again (found by make chaos at a PostgreSQL restart).
        raise
    except Exception as exc:
        logger.exception("tool %s crashed in step %s", step.tool, step.pk)
        return Outcome(
            error=ToolError("tool_error", f"{type(exc).__name__}: {exc}", False),
            cost=tool_price(step.tool),
        )


def _timed_out(step: Step) -> Outcome:
    timeout = engine.step_timeout_s(step)
    return Outcome(
        error=ToolError("timeout", f"step timed out after {timeout:g}s"),
        cost=tool_price(step.tool),
    )


def _recordable(outcome: Outcome, secrets: tuple[str, ...], tool: str) -> Outcome:
    """The outcome as it may be stored: secret values redacted (output deep, keys too;
    the error message), then the output checked: stored as JSONB, it must be plain JSON
    (no NaN), and of a bounded size."""
    error = outcome.error
    if error is not None:
        # A tool's message may quote anything it met (a response body with a NUL byte);
        # it is recorded readable rather than failing the recording itself.
        message = storable_text(redact_text(error.message, secrets) if secrets else error.message)
        error = ToolError(error.code, message, error.retryable)
    output = redact(outcome.output, secrets)
    if error is None:
        try:
            encoded = json.dumps(output, allow_nan=False)
        except (TypeError, ValueError) as exc:
            message = redact_text(f"output is not JSON: {exc}", secrets)
            return Outcome(error=ToolError("invalid_output", message, False), cost=tool_price(tool))
        if len(encoded) > MAX_OUTPUT_BYTES:
            message = f"output larger than {MAX_OUTPUT_BYTES} bytes"
            return Outcome(error=ToolError("invalid_output", message, False), cost=tool_price(tool))
        unstorable = unstorable_string(output)
        if unstorable is not None:
            message = f"output cannot be stored: {unstorable}"
            return Outcome(error=ToolError("invalid_output", message, False), cost=tool_price(tool))
    return Outcome(output=output, cost=outcome.cost, error=error, skipped=outcome.skipped)


def record(step_id: int, run_id: Any, attempt: int, outcome: Outcome) -> None:
    """Record the attempt and advance the run, in one transaction under the run's lock."""
    with transaction.atomic():
        run = services.lock_run(run_id, light=True)
        step = (
            Step.objects.select_for_update(no_key=True)
            .filter(pk=step_id, status=StepStatus.RUNNING, attempts=attempt)
            .defer("params", "output", "on_error", "when")
            .first()
        )
        if step is None:
            return  # cancelled, failed by a sweep or reclaimed meanwhile: result dropped
        outbox = Outbox()
        now = timezone.now()
        if now - (run.last_heartbeat or now) > timedelta(seconds=5):
            Run.objects.filter(pk=run.pk).update(last_heartbeat=now)
        if outcome.skipped:
            transition_locked(
                step,
                StepStatus.SKIPPED,
                message="condition is false",
                updates={"lease_expires_at": None},
                now=now,
            )
            step.status = StepStatus.SKIPPED
            engine.step_finished(run, step, outbox)
            return
        failure = engine.charge_step(run, step, outcome.cost) if outcome.cost else None
        if outcome.error is None and failure is None:
            done = transition_locked(
                step,
                StepStatus.COMPLETED,
                payload={"cost": str(outcome.cost)},
                updates={
                    "output": outcome.output,
                    "cost": step.cost + outcome.cost,
                    "lease_expires_at": None,
                },
                now=now,
            ).obj
            engine.step_finished(run, done, outbox)
            engine.update_waiting_state(run)
            return

        error = outcome.error or ToolError(failure.code, failure.message, False)  # type: ignore[union-attr]
        if failure is not None:
            error = ToolError(failure.code, failure.message, False)
        failures = step.failures + 1
        decision = retry.decide(
            step.retry,
            code=error.code,
            retryable=error.retryable,
            attempts=attempt,
            failures=failures,
        )
        charged = outcome.cost if failure is None else Decimal(0)
        Step.objects.filter(pk=step.pk).update(
            failures=failures, error=error.as_dict(), cost=step.cost + charged
        )
        step.failures, step.error, step.cost = failures, error.as_dict(), step.cost + charged
        if decision.retry:
            due = now + timedelta(milliseconds=decision.delay_ms)
            transition_locked(
                step,
                StepStatus.PENDING,
                message=f"retry in {decision.delay_ms} ms after {error.code}",
                payload={**error.as_dict(), "delay_ms": decision.delay_ms, "attempt": attempt},
                updates={"next_run_at": due, "lease_expires_at": None},
                now=now,
            )
            outbox.add(
                StepMessage(
                    step.pk, run.priority, engine.step_timeout_s(step), decision.delay_ms / 1000
                )
            )
            return
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
        engine.step_failed(run, step, engine.Failure(decision.code, message), outbox)
