"""Text that PostgreSQL can store.

PostgreSQL's ``text`` and ``jsonb`` refuse NUL characters, and UTF-8 has no encoding for
an unpaired surrogate; a string holding either fails the whole transaction with a
``DataError``. Input at the API is refused before it gets this far (``api.parsers``);
what reaches the services from elsewhere (an operator's note in the admin, a tool's
error message, a reason typed at the CLI) is free text worth keeping, so
``storable_text`` replaces the offending characters with U+FFFD instead of failing an
operation over a note.

Pure Python, no Django.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

__all__ = ["REPLACEMENT", "storable_text", "text_problem", "unstorable_string"]

REPLACEMENT = "\ufffd"

_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def text_problem(text: str) -> str | None:
    """Why PostgreSQL could not store ``text`` (jsonb, text columns), or None."""
    if "\x00" in text:
        return "contains a NUL character"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "contains an unpaired surrogate"
    return None


def storable_text(text: str) -> str:
    """``text`` with every NUL character and unpaired surrogate replaced by U+FFFD.

    A Python string cannot hold a *paired* surrogate (a pair is one code point), so every
    surrogate code point in a ``str`` is unpaired and unstorable.
    """
    if text_problem(text) is None:
        return text  # the common case: no copy
    return _UNSTORABLE.sub(REPLACEMENT, text)


def unstorable_string(value: Any) -> str | None:
    """Where in a JSON-like ``value`` the first unstorable string is (keys too), and why:
    ``"$.body[2]: contains a NUL character"``; None when every string is storable.
    Iterative, so a deep value cannot exhaust the stack."""
    stack: list[tuple[Any, str]] = [(value, "$")]
    while stack:
        item, path = stack.pop()
        if isinstance(item, str):
            problem = text_problem(item)
            if problem is not None:
                return f"{path}: {problem}"
        elif isinstance(item, Mapping):
            for key, child in item.items():
                if isinstance(key, str) and text_problem(key) is not None:
                    return f"{path}: a key {text_problem(key)}"
                stack.append((child, f"{path}.{key}"))
        elif isinstance(item, (list, tuple)):
            stack.extend((child, f"{path}[{index}]") for index, child in enumerate(item))
    return None
