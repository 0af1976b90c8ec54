"""Secret values out of what a step leaves behind: its output, its error, its logs; and
callback URLs' tokens out of log lines.

The executor knows the values of the `${secrets.NAME}` references it resolved for an
attempt; ``redact`` replaces each of them, in every string of a JSON-like value (keys
included), by ``[redacted]``. While the tool runs, ``redacting(values)`` publishes them in
a context variable that ``config.logging.RedactSecrets`` reads, so that a log line
formatted in that process meanwhile (the tool's own, a traceback) is redacted too.

Only verbatim occurrences are found: a tool that encodes a value (base64 for basic
auth, percent-encoding in a URL) and returns the encoded form is not redacted. An empty
value is never redacted (there is nothing to replace).

A callback URL (``/api/v1/callbacks/<id>.<secret>``) is a credential: whoever holds it
ends its step. ``without_callback_tokens`` writes it ``<id>.[redacted]``, for the log
filter and gunicorn's access log (``config.access_log``).

Pure Python, no Django: the logging configuration imports it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

__all__ = [
    "CALLBACK_PATH",
    "REDACTED",
    "active_values",
    "redact",
    "redact_text",
    "redactable",
    "redacting",
    "without_callback_tokens",
]

REDACTED = "[redacted]"
# Where a callback step's URL points (api/urls.py): its last segment is the token.
CALLBACK_PATH = "/api/v1/callbacks/"
# The token: what follows the path up to the end of the segment (a query, a quote, a
# space); the id before its first dot is kept, to tell callbacks apart in a log.
_CALLBACK_TOKEN = re.compile(re.escape(CALLBACK_PATH) + r"([0-9A-Fa-f]*)([^/?#\s\"']*)")

# The values of the attempt whose tool is running in this thread, for the log filter.
_active: ContextVar[tuple[str, ...]] = ContextVar("orchestrator_secret_values", default=())


def redactable(values: Iterable[str]) -> tuple[str, ...]:
    """The values worth redacting: non-empty, distinct, longest first (so that a secret
    containing another is replaced whole, not around the shorter one)."""
    return tuple(sorted({value for value in values if value}, key=len, reverse=True))


def _pattern(values: Iterable[str]) -> re.Pattern[str] | None:
    ordered = redactable(values)
    if not ordered:
        return None
    # One pass over the text: a replacement is never searched again, so "[redacted]"
    # itself is not rewritten when a short secret occurs in it.
    return re.compile("|".join(re.escape(value) for value in ordered))


def redact_text(text: str, values: Iterable[str]) -> str:
    pattern = _pattern(values)
    return text if pattern is None else pattern.sub(REDACTED, text)


def redact(value: Any, values: Iterable[str]) -> Any:
    """A copy of a JSON-like value with every value replaced in every string and key.

    Iterative: a tool's output may nest as deep as JSON allows. Tuples come back as lists;
    non-string leaves are kept as they are.
    """
    pattern = _pattern(values)
    if pattern is None:
        return value
    root: list[Any] = [None]
    stack: list[tuple[Any, Any, Any]] = [(value, root, 0)]
    while stack:
        item, parent, key = stack.pop()
        if isinstance(item, str):
            parent[key] = pattern.sub(REDACTED, item)
        elif isinstance(item, Mapping):
            copy: dict[Any, Any] = {}
            parent[key] = copy
            for name, child in item.items():
                new_name = pattern.sub(REDACTED, name) if isinstance(name, str) else name
                copy[new_name] = None  # placed now, so the copy keeps the key order
                stack.append((child, copy, new_name))
        elif isinstance(item, list | tuple):
            items: list[Any] = [None] * len(item)
            parent[key] = items
            stack.extend((child, items, index) for index, child in enumerate(item))
        else:
            parent[key] = item
    return root[0]


@contextmanager
def redacting(values: Iterable[str]) -> Iterator[None]:
    """Have the log filter redact ``values`` until the block ends."""
    token = _active.set(redactable(values))
    try:
        yield
    finally:
        _active.reset(token)


def active_values() -> tuple[str, ...]:
    return _active.get()


def _hidden(match: re.Match[str]) -> str:
    identifier, rest = match[1], match[2]
    if len(identifier) != 32:  # not a callback's id: all of it may be secret
        return f"{CALLBACK_PATH}{REDACTED}" if match[0] != CALLBACK_PATH else match[0]
    return f"{CALLBACK_PATH}{identifier}.{REDACTED}" if rest else match[0]


def without_callback_tokens(text: str) -> str:
    """``text`` with every callback URL's token replaced: ``/api/v1/callbacks/<id>.[redacted]``."""
    return _CALLBACK_TOKEN.sub(_hidden, text) if CALLBACK_PATH in text else text
