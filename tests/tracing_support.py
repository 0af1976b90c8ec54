"""Traces in tests (docs/observability.md): the test process's tracer provider, its spans
kept in memory (``traced``), and an OTLP/HTTP collector on the loopback that the
session's Celery worker exports to (``otlp_collector``, tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from common import tracing
from config import otel

# The worker exports often, so that a test waits tenths of a second for its spans.
WORKER_SCHEDULE_DELAY_MS = 100

_memory = InMemorySpanExporter()
_provider: TracerProvider | None = None
_exporting_to: set[str] = set()


def provider() -> TracerProvider:
    """The test process's provider (OpenTelemetry allows one per process): every span
    kept in memory, and exported to the collectors ``export_to`` named."""
    global _provider
    if _provider is None:
        _provider = TracerProvider(resource=Resource.create({"service.name": "orchestrator-tests"}))
        _provider.add_span_processor(SimpleSpanProcessor(_memory))
        otel.install(_provider)
        tracing.enable(False)  # on only inside ``traced``
    return _provider


def export_to(endpoint: str) -> None:
    if endpoint not in _exporting_to:
        exporter = OTLPSpanExporter(endpoint=f"{endpoint}/v1/traces")
        provider().add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=50))
        _exporting_to.add(endpoint)


def traced_spans() -> Iterator[InMemorySpanExporter]:
    """Tracing on in this process for a test; its finished spans in the exporter."""
    provider()
    _memory.clear()
    tracing.enable(True)
    try:
        yield _memory
    finally:
        tracing.enable(False)
        provider().force_flush()
        _memory.clear()


def by_name(spans: tuple[ReadableSpan, ...] | list[ReadableSpan]) -> dict[str, ReadableSpan]:
    return {span.name: span for span in spans}
