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

import yaml
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


class BoundedParser(BaseParser):
    """A body of at most ``API_MAX_BODY_BYTES``, refused (413) before anything of it is
    decoded; the subclass's ``load`` decodes and checks it."""

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
        return self.load(raw, encoding)

    def load(self, raw: bytes, encoding: str) -> Any:
        raise NotImplementedError


class BoundedJSONParser(BoundedParser):
    """`application/json`, at most ``API_MAX_BODY_BYTES``, strict numbers and strings."""

    media_type = "application/json"
    renderer_class = JSONRenderer
    any_string_values = False

    def load(self, raw: bytes, encoding: str) -> Any:
        try:
            text = raw.decode(encoding)
            data = json.loads(text, parse_constant=_constant, parse_float=_finite_float)
        except RecursionError as exc:
            raise ParseError(f"JSON nests deeper than {MAX_NESTING} levels") from exc
        except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, too many digits
            raise ParseError(f"JSON parse error: {exc}") from exc
        check_storable(data, any_string_values=self.any_string_values)
        return data


class InvalidYaml(ParseError):
    default_code = "invalid_yaml"


class _SafeWithoutAliases(yaml.SafeLoader):
    """PyYAML's safe loading (plain data only, no object construction), refusing
    anchors' aliases: an alias is a copy of what it names, and a body of a few hundred
    bytes can expand to gigabytes that way."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]
            raise yaml.composer.ComposerError(
                None, None, "aliases (*name) are not accepted: write the value out", mark
            )
        return super().compose_node(parent, index)


def _json_like(data: Any) -> None:
    """Only what JSON can say: text keys, no dates, sets, binary, NaN or Infinity (YAML
    has them all); iterative, as ``check_storable``."""
    stack = [data]
    while stack:
        item = stack.pop()
        if isinstance(item, Mapping):
            for key, value in item.items():
                if not isinstance(key, str):
                    raise InvalidYaml(f"keys must be text; quote {key!r}")
                stack.append(value)
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, float):
            if not math.isfinite(item):
                raise InvalidYaml("numbers must be finite: .nan and .inf are not accepted")
        elif item is not None and not isinstance(item, str | bool | int):
            raise InvalidYaml(
                f"only JSON's types are accepted, not {type(item).__name__}: quote {item!r}"
            )


class BoundedYAMLParser(BoundedParser):
    """`application/yaml`: the same body as JSON, written as YAML (plans are easier to
    write that way). Safe loading only, without aliases; the same bounds as JSON (size,
    nesting, storable strings) and nothing JSON could not say."""

    media_type = "application/yaml"

    def load(self, raw: bytes, encoding: str) -> Any:
        try:
            data = yaml.load(raw.decode(encoding), Loader=_SafeWithoutAliases)  # noqa: S506 - a SafeLoader
        except RecursionError as exc:
            raise InvalidYaml(f"YAML nests deeper than {MAX_NESTING} levels") from exc
        except (yaml.YAMLError, ValueError) as exc:  # ValueError: UnicodeDecodeError
            raise InvalidYaml(f"YAML parse error: {exc}") from exc
        _json_like(data)
        try:
            check_storable(data)
        except ParseError as exc:
            raise InvalidYaml(str(exc.detail).replace("JSON", "YAML")) from exc
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
