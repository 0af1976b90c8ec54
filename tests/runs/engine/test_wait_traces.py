"""A callback's wait as a span of the run's trace (runs.waits.callbacks), in process with the
SDK's in-memory exporter: under the attempt that parked, from the wait's creation to
the post that ended it (docs/observability.md)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from common import tracing
from runs.models import StepWait
from runs.waits import callbacks
from tests.runs.engine.harness import EngineRun
from tests.runs.engine.test_waits import HOOK, open_and_park, plan_with


def test_a_callbacks_wait_is_a_span_under_the_attempt_that_parked(
    traced: InMemorySpanExporter, engine_run: Callable[[dict[str, Any]], EngineRun]
) -> None:
    engine = engine_run(plan_with(HOOK))
    assert engine.run.trace_context
    with tracing.span("step hook", parent_context=engine.run.trace_context) as attempt:
        step, token = open_and_park(engine)
    assert step.trace_context == tracing.traceparent(attempt)
    with engine._committed():
        callbacks.receive_callback(token, status="completed", result={"answer": 42})
    (wait,) = [s for s in traced.get_finished_spans() if s.name == "wait callback"]
    assert wait.parent is not None
    assert wait.parent.span_id == attempt.get_span_context().span_id
    assert wait.attributes is not None
    assert wait.attributes["orchestrator.wait.outcome"] == "completed"
    created = StepWait.objects.get(step=step).created_at
    assert wait.start_time == int(created.timestamp() * 1e9)
