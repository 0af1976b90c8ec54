"""One JSON object per log line, so log shippers need no parsing rules; and no secret
value in any line."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime

from common.logcontext import FIELDS, TRACE_FIELDS
from common.redaction import (
    CALLBACK_PATH,
    active_values,
    redact_text,
    without_callback_tokens,
)

# Attributes every LogRecord has; anything else was passed with `extra=` and is emitted.
_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        payload: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                payload[key] = value
        # exc_text first: RedactSecrets leaves a redacted traceback there.
        if record.exc_text:
            payload["exc_info"] = record.exc_text
        elif record.exc_info:
            payload["exc_info"] = self.formatException(record.exc_info)
        return json.dumps(payload, default=str)


class TextFormatter(logging.Formatter):
    """A plain line, then what it is about in brackets (the run, step and attempt bound by
    ``common.logcontext``, and the trace and span ids with tracing on), when anything is."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        line = super().formatMessage(record)
        found = vars(record)
        about = " ".join(f"{key}={found[key]}" for key in (*FIELDS, *TRACE_FIELDS) if key in found)
        return f"{line} [{about}]" if about else line


class RedactSecrets(logging.Filter):
    """Replace the secret values of the step attempt in progress (``common.redaction``)
    in a record's message, traceback, stack and string extras, before it is formatted;
    and a callback URL's token in its message.

    The record is changed in place: handlers that run after this one (and the list a test's
    ``caplog`` keeps) see it redacted as well.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        # A callback URL's token is a credential (Django logs the path of every 4xx).
        try:
            message = record.getMessage()
        except (TypeError, ValueError):  # arguments that do not fit: the handler says so
            return True
        if CALLBACK_PATH in message:
            record.msg, record.args = without_callback_tokens(message), ()
        values = active_values()
        if not values:
            return True
        record.msg = redact_text(record.getMessage(), values)
        record.args = ()
        if record.exc_info:
            # Formatted now, while the values are known; the raw exception is dropped so
            # that no later handler formats it again.
            record.exc_text = record.exc_text or logging.Formatter().formatException(
                record.exc_info
            )
            record.exc_info = None
        if record.exc_text:
            record.exc_text = redact_text(record.exc_text, values)
        if record.stack_info:
            record.stack_info = redact_text(record.stack_info, values)
        for key, value in list(vars(record).items()):
            if key not in _STANDARD and isinstance(value, str):
                setattr(record, key, redact_text(value, values))
        return True
