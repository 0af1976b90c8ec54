"""The worker's spans (docs/observability.md): a step attempt's, its recording's, and the
waits an attempt knows the length of (a backoff, a rate limit's units).

Each is a child of the run's trace context, read from the run's row (``Run.trace_context``)
once per run and worker process: a doorbell names a run and a worker serves whichever
step is fairest, so the context travels in PostgreSQL, not in Celery messages. Off
(``common.tracing.enabled`` False), every function returns after that one check.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from datetime import timedelta
from typing import Any

from django.utils import timezone
from opentelemetry import trace
from opentelemetry.trace import Span

from common import tracing
from runs.engine.outcomes import Outcome
from runs.models import Run, Step
from runs.states import StepStatus

# Runs whose context this process has read (a run's never changes once it has steps).
_CONTEXTS: OrderedDict[str, str] = OrderedDict()
_CONTEXTS_KEPT = 10_000


def run_context(run_id: Any) -> str:
    """The run's stored traceparent, read once per process."""
    key = str(run_id)
    found = _CONTEXTS.get(key)
    if found is None:
        stored = Run.objects.filter(pk=run_id).values_list("trace_context", flat=True).first()
        found = _CONTEXTS[key] = stored or ""
        if len(_CONTEXTS) > _CONTEXTS_KEPT:
            _CONTEXTS.popitem(last=False)
    return found


def attempt(step: Step, number: int) -> AbstractContextManager[Span]:
    """A step attempt's span, current while the attempt runs and is recorded; a run
    created untraced (no stored context) has none."""
    if not tracing.enabled:
        return tracing.span("", parent_context="")  # the shared no-op
    return tracing.span(
        f"step {step.name}",
        parent_context=run_context(step.run_id),
        attributes={
            "orchestrator.run.id": str(step.run_id),
            "orchestrator.step.id": step.pk,
            "orchestrator.step.name": step.name,
            "orchestrator.tool": step.tool,
            "orchestrator.attempt": number,
        },
    )


@contextmanager
def recording(step: Step, number: int, outcome: Outcome) -> Iterator[Span]:
    """The recording's span (the database write of the outcome, and the next claim made
    with it), a child of the attempt's; not made current, so that what the recording
    stores as the attempt's context (a wait's) is the attempt's span."""
    span = tracing.start(
        "record",
        parent_context=None if trace.get_current_span().is_recording() else "",
        attributes={"orchestrator.step.id": step.pk, "orchestrator.attempt": number},
    )
    try:
        yield span
    except BaseException as exc:
        tracing.failed(span, type(exc).__name__, str(exc))
        raise
    finally:
        span.end()


def finished(span: Span, step: Step, outcome: Outcome, applied: bool) -> None:
    """The attempt's outcome, cost and (for a failure retried later) its retry delay on
    its span, and the backoff as a span of its own, from now to when it may run again."""
    if not tracing.enabled or not span.is_recording():
        return
    if not applied:
        result = "dropped"
    elif outcome.skipped:
        result = "skipped"
    elif outcome.wait is not None:
        result = "waiting"
    else:
        result = "failed" if outcome.error else "completed"
    span.set_attribute("orchestrator.outcome", result)
    if outcome.cost is not None:
        span.set_attribute("orchestrator.cost", float(outcome.cost))
    if outcome.wait is not None:
        span.set_attribute("orchestrator.wait.kind", str(outcome.wait.get("kind", "")))
    if outcome.error is None:
        return
    tracing.failed(span, outcome.error.code, outcome.error.message)
    span.set_attribute("orchestrator.error.code", outcome.error.code)
    if not applied:
        return
    # Whether the engine retries it, and when: read back (failures only, tracing on).
    found = Step.objects.filter(pk=step.pk).values_list("status", "next_run_at").first()
    if found is None or found[0] != StepStatus.PENDING or found[1] is None:
        span.set_attribute("orchestrator.retry", False)
        return
    now = timezone.now()
    delay = max(found[1] - now, timedelta(0))
    span.set_attribute("orchestrator.retry", True)
    span.set_attribute("orchestrator.retry.delay_ms", int(delay.total_seconds() * 1000))
    tracing.emit(
        "wait backoff",
        parent_context=tracing.traceparent(span),
        started=now,
        ended=now + delay,
        attributes={
            "orchestrator.step.id": step.pk,
            "orchestrator.wait.kind": "backoff",
            "orchestrator.retry.delay_ms": int(delay.total_seconds() * 1000),
        },
    )


def rate_limit_waited(waited_s: float | None, granted: Any) -> None:
    """A step granted its units after waiting for them: the wait, under its attempt."""
    if not tracing.enabled or not waited_s:
        return
    now = timezone.now()
    tracing.emit(
        "wait rate_limit",
        parent_context=tracing.traceparent(),
        started=now - timedelta(seconds=waited_s),
        ended=now,
        attributes={"orchestrator.wait.kind": "rate_limit", "orchestrator.granted": str(granted)},
    )
