"""JSON bodies, bounded: size (413), nesting, and only what PostgreSQL can store.

PostgreSQL's ``jsonb`` refuses NUL characters and unpaired surrogates, and JSON has no
NaN or Infinity; such bodies would otherwise fail deep inside a service with a database
error (a 500), so they are refused here, before any view runs, as malformed JSON.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import IO, Any

from django.conf import settings
from rest_framework.exceptions import APIException, ParseError
from rest_framework.parsers import BaseParser
from rest_framework.renderers import JSONRenderer

from common.text import text_problem
from runs.plan import json_depth, json_size

# Python's decoder recurses once per nesting level; far below its recursion limit.
MAX_NESTING = 100


class PayloadTooLarge(APIException):
    status_code = 413
    default_code = "payload_too_large"
    default_detail = "request body too large"


def body_limit() -> int:
    return int(settings.API_MAX_BODY_BYTES)


def refuse_if_too_large(content_length: str | None) -> None:
    """413 from the Content-Length header alone, before reading anything."""
    try:
        length = int(content_length or 0)
    except ValueError:
        return
    if length > body_limit():
        raise PayloadTooLarge(f"request body is {length} bytes; at most {body_limit()} allowed")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number out of range: {text}")
    return value


def _constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def check_storable(data: Any, *, any_string_values: bool = False) -> None:
    """Every string (keys too) storable by PostgreSQL, nesting bounded; iterative.

    ``any_string_values`` lets values, not keys, be any string: for a body whose values
    are never stored as text (a secret's value is stored encrypted).
    """
    stack: list[tuple[Any, int, bool]] = [(data, 1, False)]
    while stack:
        item, depth, is_key = stack.pop()
        if depth > MAX_NESTING:
            raise ParseError(f"JSON nests deeper than {MAX_NESTING} levels")
        if isinstance(item, str):
            if (is_key or not any_string_values) and text_problem(item) is not None:
                raise ParseError("strings must not contain NUL characters or unpaired surrogates")
        elif isinstance(item, Mapping):
            for key, value in item.items():
                stack.append((key, depth, True))
                stack.append((value, depth + 1, False))
        elif isinstance(item, list):
            stack.extend((value, depth + 1, False) for value in item)


class BoundedJSONParser(BaseParser):
    """`application/json`, at most ``API_MAX_BODY_BYTES``, strict numbers and strings."""

    media_type = "application/json"
    renderer_class = JSONRenderer
    any_string_values = False

    def parse(
        self,
        stream: IO[Any],
        media_type: str | None = None,
        parser_context: Mapping[str, Any] | None = None,
    ) -> Any:
        limit = body_limit()
        raw = stream.read(limit + 1)
        if len(raw) > limit:
            raise PayloadTooLarge(f"request body is larger than {limit} bytes")
        encoding = (parser_context or {}).get("encoding") or settings.DEFAULT_CHARSET
        try:
            text = raw.decode(encoding)
            data = json.loads(text, parse_constant=_constant, parse_float=_finite_float)
        except RecursionError as exc:
            raise ParseError(f"JSON nests deeper than {MAX_NESTING} levels") from exc
        except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, too many digits
            raise ParseError(f"JSON parse error: {exc}") from exc
        check_storable(data, any_string_values=self.any_string_values)
        return data


class AnyStringJSONParser(BoundedJSONParser):
    """Bounded JSON whose values may be any string, NUL and unpaired surrogates included
    (keys may not: they are echoed in error messages). For a view that stores no string
    of the body as text: a secret's value, encrypted."""

    any_string_values = True


def plan_size_hint(plan: Any, content_length: str | None) -> int | None:
    """The plan's size for ``parse_plan``; 413 when it is over the plan size limit.

    A plan within a body that fits the limit fits too, and the body's length spares
    ``parse_plan`` measuring it; only a larger body needs the plan measured.
    """
    limit = int(settings.ORCHESTRATOR_PLAN_LIMITS["max_spec_bytes"])
    try:
        body_bytes = int(content_length or 0)
    except ValueError:
        body_bytes = 0
    if 0 < body_bytes <= limit:
        return body_bytes
    if json_depth(plan, MAX_NESTING) > MAX_NESTING:
        return None  # parse_plan reports the nesting itself
    size = json_size(plan)
    if size is not None and size > limit:
        raise PayloadTooLarge(f"the plan is {size} bytes; at most {limit} allowed")
    return size
