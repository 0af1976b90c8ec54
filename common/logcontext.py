"""What a log line is about: the run, step, attempt and organization being worked on,
added to every log record made while they are bound (``bound``), whichever logger
makes it (a tool's, Celery's, psycopg's), so that one run can be followed across the
web, worker and beat logs (docs/operations.md, Logs). With tracing on, records also
carry the current span's ``trace_id`` and ``span_id``, so that a line leads to its span and back.

A context variable holds them: per thread, per gevent greenlet (the web's requests) and
per asyncio task, so that concurrent work never borrows another's fields. ``install``
puts them on records through the log record factory, which every handler sees (a
handler's filter would miss the others, pytest's included)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any
from uuid import UUID

from common import tracing

# The fields, in the order people read them; with tracing on, the current span's ids
# follow them (``trace_id``, ``span_id``: common.tracing), whatever is bound.
FIELDS = ("organization_id", "run_id", "step_id", "attempt")
TRACE_FIELDS = ("trace_id", "span_id")

_bound: ContextVar[dict[str, Any] | None] = ContextVar("log_context", default=None)


def _plain(value: Any) -> Any:
    return str(value) if isinstance(value, UUID) else value


@contextmanager
def bound(**fields: Any) -> Iterator[dict[str, Any]]:
    """Add ``fields`` (those not None) to every log record made inside; nested bindings
    add to the outer ones. Yields the bound mapping, which ``add`` extends."""
    current = _bound.get() or {}
    mapping = {**current, **{key: _plain(v) for key, v in fields.items() if v is not None}}
    token = _bound.set(mapping)
    try:
        yield mapping
    finally:
        _bound.reset(token)


def add(**fields: Any) -> None:
    """Add ``fields`` to the innermost binding (a request's, once it knows its
    organization); nothing when none is bound."""
    current = _bound.get()
    if current is not None:
        current.update({key: _plain(v) for key, v in fields.items() if v is not None})


def current() -> dict[str, Any]:
    return dict(_bound.get() or {})


def install() -> None:
    """Wrap the log record factory once (per process) so records carry what is bound."""
    previous = logging.getLogRecordFactory()
    if getattr(previous, "log_context", False):
        return

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        for key, value in (_bound.get() or {}).items():
            record.__dict__.setdefault(key, value)
        if tracing.enabled:
            found = tracing.ids()
            if found is not None:
                record.__dict__.setdefault("trace_id", found[0])
                record.__dict__.setdefault("span_id", found[1])
        return record

    factory.log_context = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(factory)
