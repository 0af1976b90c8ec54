"""Traces (OpenTelemetry), for every layer: spans started from a stored ``traceparent``,
the current one stored, spans emitted after the fact from the database's timestamps.

A run's trace context is kept on the run in PostgreSQL (``Run.trace_context``, a W3C
``traceparent``), not in Celery messages: a doorbell names a run and the worker serves
whichever step is fairest, so whoever works on the run rebuilds its parent from the row
(docs/observability.md). A step parked on a wait keeps its attempt's context
(``Step.trace_context``), a runner job its step's (``RunnerJob.trace_context``).

Off unless ``config.otel.setup`` installed an SDK (OTEL_EXPORTER_OTLP_ENDPOINT set):
then ``enabled`` is False and every helper returns at once, after that one check,
with nothing started, attached or read (the executor's hot path pays nothing more).
It imports no app.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from datetime import datetime
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Link, Span, SpanContext, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

# Set by ``config.otel.setup`` once a provider is installed; read, never set, elsewhere.
enabled = False

TRACER_NAME = "orchestrator"
# The longest traceparent stored (version 00 is 55 characters; room for a future one).
MAX_LENGTH = 128

_propagator = TraceContextTextMapPropagator()
_OFF: AbstractContextManager[Span] = nullcontext(trace.INVALID_SPAN)
Attributes = Mapping[str, Any]


_tracer: trace.Tracer | None = None


def enable(on: bool) -> None:
    global enabled, _tracer
    enabled = on
    _tracer = None  # the provider may have changed


def tracer() -> trace.Tracer:
    """The project's tracer, got once (the SDK's ``get_tracer`` costs tens of
    microseconds a call: more than the spans of a step)."""
    global _tracer
    if _tracer is None:
        _tracer = trace.get_tracer(TRACER_NAME)
    return _tracer


# --------------------------------------------------------------------------- contexts
def traceparent(span: Span | None = None) -> str:
    """The W3C traceparent of ``span`` (the current span by default); "" when there is
    none or tracing is off."""
    if not enabled:
        return ""
    context = (span or trace.get_current_span()).get_span_context()
    if not context.is_valid:
        return ""
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


def parent(stored: str) -> otel_context.Context | None:
    """The context a stored traceparent names, as a span's parent; None when there is
    none (a run created while tracing was off): its spans then start traces of their own."""
    return _parsed(stored) if stored else None


@functools.lru_cache(maxsize=4096)
def _parsed(stored: str) -> otel_context.Context | None:
    """Parsed once per process and context (a worker parses its runs' at every step)."""
    context = _propagator.extract({"traceparent": stored})
    if not trace.get_current_span(context).get_span_context().is_valid:
        return None
    return context


def span_context(stored: str) -> SpanContext | None:
    found = parent(stored)
    return None if found is None else trace.get_current_span(found).get_span_context()


def link(stored: str, **attributes: Any) -> list[Link]:
    """A span link to the span a stored traceparent names (none when it names none)."""
    context = span_context(stored)
    return [] if context is None else [Link(context, attributes or None)]


def link_current(stored: str, **attributes: Any) -> None:
    """Link the current span to the span a stored traceparent names, when that is in
    another trace (a run's, from the request that starts it)."""
    current = traceparent()
    if not current or current[3:35] == stored[3:35]:
        return
    for found in link(stored, **attributes):
        trace.get_current_span().add_link(found.context, found.attributes)


def from_headers(headers: Mapping[str, str]) -> otel_context.Context | None:
    """The context a request's W3C ``traceparent`` (and ``tracestate``) continue: a WSGI
    environ (``HTTP_TRACEPARENT``) or plain header names."""
    carrier = {
        name: headers.get(f"HTTP_{name.upper()}") or headers.get(name) or ""
        for name in ("traceparent", "tracestate")
    }
    if not carrier["traceparent"]:
        return None
    context = _propagator.extract(carrier)
    return context if trace.get_current_span(context).get_span_context().is_valid else None


def ids() -> tuple[str, str] | None:
    """The current trace and span ids, as hex, for log lines; None when there is none."""
    if not enabled:
        return None
    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return None
    return f"{context.trace_id:032x}", f"{context.span_id:016x}"


# --------------------------------------------------------------------------- spans
def span(
    name: str,
    *,
    parent_context: str | otel_context.Context | None = None,
    kind: SpanKind = SpanKind.INTERNAL,
    attributes: Attributes | None = None,
    links: Sequence[Link] = (),
) -> AbstractContextManager[Span]:
    """A span made current for the block: a child of ``parent_context`` (a stored
    traceparent, or a context) when given, of the current span otherwise. Off, or a
    stored context that is empty (an untraced run: nothing is traced for it): a no-op
    whose span ignores every call."""
    if not enabled:
        return _OFF
    context = parent(parent_context) if isinstance(parent_context, str) else parent_context
    if context is None and isinstance(parent_context, str):
        return _OFF
    return tracer().start_as_current_span(
        name, context=context, kind=kind, attributes=attributes, links=links
    )


def start(
    name: str,
    *,
    parent_context: str | None = None,
    attributes: Attributes | None = None,
) -> Span:
    """A span started but not made current (the caller ends it): a child of the stored
    ``parent_context``, or (None) of the current span. Off, or an empty stored context
    (untraced): the invalid span, a no-op."""
    if not enabled:
        return trace.INVALID_SPAN
    context = parent(parent_context) if parent_context is not None else None
    if context is None and parent_context is not None:
        return trace.INVALID_SPAN
    return tracer().start_span(name, context=context, attributes=attributes)


def emit(
    name: str,
    *,
    parent_context: str,
    started: datetime,
    ended: datetime,
    attributes: Attributes | None = None,
    links: Sequence[Link] = (),
) -> None:
    """A span that already happened (a wait), from the database's timestamps, a child
    of the stored ``parent_context``; nothing when that is empty (untraced)."""
    if not enabled:
        return
    context = parent(parent_context)
    if context is None:
        return
    begun = tracer().start_span(
        name,
        context=context,
        attributes=attributes,
        links=links,
        start_time=_nanoseconds(started),
    )
    begun.end(end_time=max(_nanoseconds(ended), _nanoseconds(started)))


def root(name: str, *, links: Sequence[Link] = (), attributes: Attributes | None = None) -> str:
    """A new trace: its root span, ended at once, and its traceparent (for a run that no
    request started: a schedule's, or a child run, linked to its parent step)."""
    if not enabled:
        return ""
    begun = tracer().start_span(
        name, context=otel_context.Context(), links=links, attributes=attributes
    )
    begun.end()
    return traceparent(begun)


def run_context(*, linked_to: str = "", attributes: Attributes | None = None) -> str:
    """The trace context a new run keeps: the current span's (the API request that
    creates it, whose trace may continue a client's), or a trace of its own when there
    is none, or when the run is a child (``linked_to``: the parent step's context,
    linked). "" when tracing is off."""
    if not enabled:
        return ""
    if linked_to:
        return root("run", links=link(linked_to, relation="parent step"), attributes=attributes)
    current = traceparent()
    return current or root("run", attributes=attributes)


def annotate(**attributes: Any) -> None:
    """Set attributes on the current span (``orchestrator.`` prefixed, dots for
    underscores): the run a request created, say."""
    if not enabled:
        return
    current = trace.get_current_span()
    for key, value in attributes.items():
        current.set_attribute("orchestrator." + key.replace("_", "."), value)


def failed(span: Span, code: str, message: str = "") -> None:
    span.set_status(Status(StatusCode.ERROR, f"{code}: {message}"[:500] if message else code))


def _nanoseconds(moment: datetime) -> int:
    return int(moment.timestamp() * 1_000_000_000)
