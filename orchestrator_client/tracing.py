"""Traces for the reference runner (docs/observability.md), through the OpenTelemetry API
alone: a job's span continues the step attempt's trace its poll handed over.

On when the process has an SDK tracer provider: ``setup`` installs one when
``OTEL_EXPORTER_OTLP_ENDPOINT`` is set, which the SDK configures from the standard
``OTEL_*`` variables (the ones the server reads: docs/configuration.md). The client does
not need OpenTelemetry to work: without it (``pip install 'run-orchestrator[tracing]'``
adds it) nothing is traced, and ``setup`` refuses an endpoint it could not export to.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer

# The server's tracer name (common/tracing.py): one instrumentation scope for the project.
TRACER_NAME = "orchestrator"


def setup(service_name: str, process: str) -> bool:
    """Install the SDK's tracer provider, exporting over OTLP/HTTP, when
    ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set; whether tracing is on. ``service_name`` unless
    ``OTEL_SERVICE_NAME`` says; ``process`` as the resource's ``orchestrator.process``."""
    if not os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        return False
    try:
        from opentelemetry import trace
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:
        raise SystemExit(
            f"OTEL_EXPORTER_OTLP_ENDPOINT is set, but OpenTelemetry is not installed ({exc}): "
            "pip install 'run-orchestrator[tracing]'"
        ) from exc
    # The sampler, the exporter's endpoint, headers and timeout and the export delay are
    # the SDK's own readings of OTEL_TRACES_SAMPLER, OTEL_EXPORTER_OTLP_* and OTEL_BSP_*.
    provider = TracerProvider(
        resource=Resource.create(
            {
                "service.name": os.environ.get("OTEL_SERVICE_NAME") or service_name,
                "service.namespace": "orchestrator",
                "orchestrator.process": process,
            }
        )
    )
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    return True


def _tracer() -> Tracer | None:
    """The tracer, or None while no SDK provider is installed (or OpenTelemetry is not)."""
    try:
        from opentelemetry import trace
    except ImportError:
        return None
    if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        return None
    return trace.get_tracer(TRACER_NAME)


def start(name: str, *, traceparent: str, attributes: Mapping[str, Any]) -> Span | None:
    """A span started (not made current; ``end`` ends it) as a child of the W3C
    ``traceparent``; None when tracing is off or there is no parent (an untraced run)."""
    tracer = _tracer()
    if tracer is None or not traceparent:
        return None
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    parent = TraceContextTextMapPropagator().extract({"traceparent": traceparent})
    if not trace.get_current_span(parent).get_span_context().is_valid:
        return None
    return tracer.start_span(name, context=parent, attributes=attributes)


def traceparent_of(span: Span | None) -> str:
    """The span's W3C traceparent, for a process it starts (``TRACEPARENT``); "" for none."""
    if span is None:
        return ""
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier, context=trace.set_span_in_context(span))
    return carrier.get("traceparent", "")


def end(span: Span | None, attributes: Mapping[str, Any], *, error: str = "") -> None:
    """Set ``attributes``, the error status when ``error`` says what went wrong, and end."""
    if span is None:
        return
    from opentelemetry.trace import Status, StatusCode

    span.set_attributes(attributes)
    if error:
        span.set_status(Status(StatusCode.ERROR, error))
    span.end()


def flush(timeout_ms: int = 5000) -> None:
    """Export what is finished (a process about to exit)."""
    try:
        from opentelemetry import trace
    except ImportError:
        return
    force_flush = getattr(trace.get_tracer_provider(), "force_flush", None)
    if force_flush is not None:
        force_flush(timeout_ms)
