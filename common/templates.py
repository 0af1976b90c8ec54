"""`${...}` templates in run-plan step parameters.

A run plan's step `params` may contain strings such as
`"https://x.invalid/search?q=${variables.topic}"`. This module parses those strings,
lists the references they contain (so a plan can be validated before it runs) and renders
them against whatever the engine knows when the step is about to start.

Design:

* A reference is a path, parsed once into a tuple of segments (`Reference`): the root is
  an identifier (`tasks`, `steps`, `variables`, ...), followed by `.name` segments,
  `[N]` list indexes and `["any key"]` / `['any key']` quoted keys. Identifiers may
  contain hyphens because step names do.
* Parsing is a small hand-written scanner, not a regular expression, so that a quoted key
  may contain `}` or `.` and every error carries the position where it was detected.
* Rendering never evaluates anything: the caller supplies a `resolve` callable that maps a
  `Reference` to a value (`resolve_in` is one for plain nested dicts and lists). When a
  string is exactly one reference the resolved value is returned as-is, so
  `"${steps.fetch.output}"` can pass a whole object to the next step; otherwise each value
  is formatted as text and spliced in.
* `$${` is the escape for a literal `${`; a `$` that does not start `${` is literal.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeAlias

__all__ = [
    "Reference",
    "Template",
    "TemplateError",
    "UnresolvedReference",
    "find_references",
    "format_reference",
    "json_type_name",
    "parse_reference",
    "read_quoted",
    "render_value",
    "resolve_in",
    "scan_reference",
    "secret_references",
    "template_errors",
]

Reference: TypeAlias = tuple[str | int, ...]
Resolver: TypeAlias = Callable[[Reference], Any]

_IDENT_START = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz_")
_IDENT_CHARS = _IDENT_START | frozenset("0123456789-")
_DIGITS = frozenset("0123456789")
_QUOTES = frozenset("\"'")
_KEY_ESCAPES = {"\\": "\\", '"': '"', "'": "'"}


class TemplateError(ValueError):
    """A malformed template or reference; `position` is an index into the parsed text."""

    def __init__(self, message: str, position: int | None = None) -> None:
        self.message = message
        self.position = position
        super().__init__(message if position is None else f"{message} (at position {position})")

    def __reduce__(self) -> tuple[type[TemplateError], tuple[str, int | None]]:
        # Keep message and position apart when pickled (e.g. in a Celery result).
        return (type(self), (self.message, self.position))


class UnresolvedReference(LookupError):
    """Raised by resolvers when a reference names nothing; rendering lets it propagate."""

    def __init__(self, message: str, reference: Reference | None = None) -> None:
        self.message = message
        self.reference = reference
        super().__init__(message)

    def __reduce__(self) -> tuple[type[UnresolvedReference], tuple[str, Reference | None]]:
        return (type(self), (self.message, self.reference))


def _is_identifier(text: str) -> bool:
    return bool(text) and text[0] in _IDENT_START and all(c in _IDENT_CHARS for c in text)


def _describe(text: str, pos: int) -> str:
    return repr(text[pos]) if pos < len(text) else "the end of the text"


def _skip_space(text: str, pos: int) -> int:
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos


def _read_identifier(text: str, pos: int, after: str) -> tuple[str, int]:
    if pos >= len(text) or text[pos] not in _IDENT_START:
        raise TemplateError(f"expected a name {after}, found {_describe(text, pos)}", pos)
    end = pos + 1
    while end < len(text) and text[end] in _IDENT_CHARS:
        end += 1
    return text[pos:end], end


def read_quoted(
    text: str,
    start: int,
    escapes: Mapping[str, str],
    error: Callable[[str, int], Exception],
    *,
    unterminated: str,
    unknown_escape: str,
) -> tuple[str, int]:
    """The quoted text that opens at ``start`` (with ``'`` or ``"``), each backslash and
    the character after it replaced by ``escapes``' value for that character, and the
    position after the closing quote. A template's quoted key and a condition's string
    literal are read alike, each refused in its own words: ``error(unterminated, start)``
    when the text ends first, ``error(unknown_escape, position)`` at the backslash of an
    escape ``escapes`` does not hold."""
    quote = text[start]
    chars: list[str] = []
    i = start + 1
    while i < len(text):
        c = text[i]
        if c == quote:
            return "".join(chars), i + 1
        if c == "\\":
            escaped = text[i + 1] if i + 1 < len(text) else ""
            if escaped not in escapes:
                raise error(unknown_escape, i)
            chars.append(escapes[escaped])
            i += 2
            continue
        chars.append(c)
        i += 1
    raise error(unterminated, start)


def _read_index(text: str, pos: int) -> tuple[str | int, int]:
    """Read what follows a `[`: an integer index or a quoted key, then the `]`."""
    if pos < len(text) and text[pos] in _DIGITS:
        end = pos
        while end < len(text) and text[end] in _DIGITS:
            end += 1
        segment: str | int = int(text[pos:end])
    elif pos < len(text) and text[pos] in _QUOTES:
        segment, end = read_quoted(
            text, pos, _KEY_ESCAPES, TemplateError,
            unterminated="unterminated quoted key",
            unknown_escape="unknown escape in quoted key (only \\\\, \\\" and \\' are allowed)",
        )  # fmt: skip
    elif pos < len(text) and text[pos] == "-":
        raise TemplateError("list indexes must be non-negative integers", pos)
    else:
        raise TemplateError(
            f"expected an integer index or a quoted key after '[', found {_describe(text, pos)}",
            pos,
        )
    if end >= len(text) or text[end] != "]":
        raise TemplateError(f"expected ']' to close '[', found {_describe(text, end)}", end)
    return segment, end + 1


def _read_path(text: str, pos: int) -> tuple[Reference, int]:
    """Read a root identifier and its `.name` / `[N]` / `["key"]` segments from `pos`."""
    root, pos = _read_identifier(text, pos, "at the start of the reference")
    segments: list[str | int] = [root]
    while pos < len(text):
        if text[pos] == ".":
            name, pos = _read_identifier(text, pos + 1, "after '.'")
            segments.append(name)
        elif text[pos] == "[":
            segment, pos = _read_index(text, pos + 1)
            segments.append(segment)
        else:
            break
    return tuple(segments), pos


def parse_reference(text: str) -> Reference:
    """Parse the inside of `${...}`, e.g. `steps.fetch.output.items[0]`."""
    pos = _skip_space(text, 0)
    if pos == len(text):
        raise TemplateError("empty reference", 0)
    reference, pos = _read_path(text, pos)
    pos = _skip_space(text, pos)
    if pos != len(text):
        raise TemplateError(f"unexpected {_describe(text, pos)} in reference", pos)
    return reference


def scan_reference(text: str, start: int) -> tuple[Reference, int]:
    """Parse the `${...}` that begins at `text[start]`; return it and the index after `}`.

    Shared with the expression tokeniser so both agree on where a reference ends (a quoted
    key may contain `}`). Error positions are indexes into `text`.
    """
    if not text.startswith("${", start):
        raise TemplateError("expected '${'", start)
    pos = _skip_space(text, start + 2)
    if pos == len(text):
        raise TemplateError("unclosed '${'", start)
    if text[pos] == "}":
        raise TemplateError("empty reference '${}'", start)
    reference, pos = _read_path(text, pos)
    pos = _skip_space(text, pos)
    if pos == len(text):
        raise TemplateError("unclosed '${'", start)
    if text[pos] != "}":
        raise TemplateError(f"unexpected {_describe(text, pos)} in reference", pos)
    return reference, pos + 1


def _quote_key(key: str) -> str:
    return '["' + key.replace("\\", "\\\\").replace('"', '\\"') + '"]'


def format_reference(ref: Reference) -> str:
    """Write a reference back as text: `tasks.gather.steps["a b"].output[0]`.

    `parse_reference(format_reference(ref)) == ref` whenever the root is an identifier.
    """
    parts: list[str] = []
    for i, segment in enumerate(ref):
        if isinstance(segment, int):
            parts.append(f"[{segment}]")
        elif _is_identifier(segment):
            parts.append(segment if i == 0 else f".{segment}")
        else:
            parts.append(_quote_key(segment))
    return "".join(parts)


def json_type_name(value: Any) -> str:
    """The JSON name of a value's type, for error messages aimed at plan authors."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list | tuple):
        return "list"
    if isinstance(value, Mapping):
        return "object"
    return type(value).__name__


def _a(type_name: str) -> str:
    if type_name == "null":
        return type_name
    return f"an {type_name}" if type_name[0] in "aeiou" else f"a {type_name}"


def _to_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    if isinstance(value, bool):  # before numbers: bool is an int subclass
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, Mapping | list | tuple):
        # default=str: a resolver handing back a non-JSON leaf (a datetime, say) should
        # still render rather than fail the step.
        return json.dumps(value, separators=(",", ":"), sort_keys=True, default=str)
    return str(value)


@dataclass(frozen=True)
class Template:
    """A parsed template string: literal text (`str`) and references (`tuple`) in order."""

    source: str
    parts: tuple[str | Reference, ...]

    @classmethod
    def parse(cls, text: str) -> Template:
        parts: list[str | Reference] = []
        literal: list[str] = []
        pos = 0
        while pos < len(text):
            dollar = text.find("$", pos)
            if dollar < 0:
                literal.append(text[pos:])
                break
            literal.append(text[pos:dollar])
            if text.startswith("$${", dollar):
                literal.append("${")
                pos = dollar + 3
            elif text.startswith("${", dollar):
                if any(literal):
                    parts.append("".join(literal))
                literal = []
                reference, pos = scan_reference(text, dollar)
                parts.append(reference)
            else:
                literal.append("$")
                pos = dollar + 1
        if any(literal):
            parts.append("".join(literal))
        return cls(text, tuple(parts))

    @property
    def references(self) -> list[Reference]:
        return [part for part in self.parts if isinstance(part, tuple)]

    @property
    def is_single_reference(self) -> bool:
        """True when the whole string is one `${...}` (whitespace outside it is text)."""
        return len(self.parts) == 1 and isinstance(self.parts[0], tuple)

    def render(self, resolve: Resolver) -> Any:
        """Resolve every reference; keep the value's type if the string is one reference."""
        if self.is_single_reference:
            only = self.parts[0]
            assert isinstance(only, tuple)
            return resolve(only)
        return "".join(
            _to_text(resolve(part)) if isinstance(part, tuple) else part for part in self.parts
        )


def find_references(value: Any) -> list[Reference]:
    """Every reference in every string of a JSON-like value, in document order.

    Dict keys are not templated. Raises TemplateError on the first malformed string; use
    `template_errors` to report all of them with their paths.
    """
    found: list[Reference] = []
    stack: list[Any] = [value]
    while stack:  # iterative: deeply nested client JSON must not hit the recursion limit
        item = stack.pop()
        if isinstance(item, str):
            if "$" in item:
                found.extend(Template.parse(item).references)
        elif isinstance(item, Mapping):
            stack.extend(reversed(list(item.values())))
        elif isinstance(item, list | tuple):
            stack.extend(reversed(item))
    return found


def _child_path(path: str, key: Any) -> str:
    return f"{path}.{key}" if path else str(key)


def template_errors(value: Any, path: str) -> list[tuple[str, str]]:
    """`(path, message)` for every malformed template string in a JSON-like value.

    Paths extend `path`: dict keys are joined with `.`, list items as `[i]`, so
    `template_errors({"items": ["${"]}, "params")` gives `params.items[0]`. Never raises.
    """
    errors: list[tuple[str, str]] = []
    stack: list[tuple[str, Any]] = [(path, value)]
    while stack:
        where, item = stack.pop()
        if isinstance(item, str):
            if "$" in item:
                try:
                    Template.parse(item)
                except TemplateError as error:
                    errors.append((where, str(error)))
        elif isinstance(item, Mapping):
            children = [(_child_path(where, k), v) for k, v in item.items()]
            stack.extend(reversed(children))
        elif isinstance(item, list | tuple):
            stack.extend(reversed([(f"{where}[{i}]", v) for i, v in enumerate(item)]))
    return errors


def secret_references(value: Any, path: str = "") -> list[tuple[str, Reference]]:
    """``(path, reference)`` for every reference to ``secrets`` in a JSON-like value.

    The one answer to "does this value reach a secret": read from the parsed templates,
    so that every spelling the parser accepts (``${ secrets.X }``, ``${secrets["X"]}``,
    ...) is found, and keys are searched too, though no renderer reads them today. A
    string that does not parse reaches nothing (rendering it fails before anything is
    resolved). Paths extend ``path`` as ``template_errors`` writes them.
    """
    found: list[tuple[str, Reference]] = []
    stack: list[tuple[str, Any]] = [(path, value)]
    while stack:
        where, item = stack.pop()
        if isinstance(item, str):
            found.extend((where, ref) for ref in _secret_refs(item))
        elif isinstance(item, Mapping):
            children: list[tuple[str, Any]] = []
            for key, child in item.items():
                child_path = _child_path(where, key)
                if isinstance(key, str):
                    children.append((child_path, key))
                children.append((child_path, child))
            stack.extend(reversed(children))
        elif isinstance(item, list | tuple):
            stack.extend(reversed([(f"{where}[{i}]", v) for i, v in enumerate(item)]))
    return found


def _secret_refs(text: str) -> list[Reference]:
    if "$" not in text:
        return []
    try:
        references = Template.parse(text).references
    except ValueError:  # TemplateError, or int() of an index past Python's digit limit
        return []
    return [ref for ref in references if ref[0] == "secrets"]


def render_value(value: Any, resolve: Resolver) -> Any:
    """Deep-render a JSON-like value: a new structure with every string rendered.

    Non-string leaves are returned untouched; tuples come back as lists (JSON has no
    tuples).
    """
    if isinstance(value, str):
        return Template.parse(value).render(resolve) if "$" in value else value
    if isinstance(value, Mapping):
        return {key: render_value(item, resolve) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [render_value(item, resolve) for item in value]
    return value


def resolve_in(context: Mapping[str, Any], ref: Reference) -> Any:
    """Resolve `ref` by walking nested mappings (string keys) and lists (integer indexes).

    Strings are not indexable and an integer never matches a string key: the path must
    match the data's shape exactly. Raises UnresolvedReference naming the reference.
    """
    current: Any = context
    for i, segment in enumerate(ref):
        where = format_reference(ref[:i]) if i else "the context"
        if isinstance(current, Mapping) and isinstance(segment, str):
            if segment not in current:
                raise UnresolvedReference(
                    f"cannot resolve {format_reference(ref)}: {where} has no key {segment!r}",
                    ref,
                )
            current = current[segment]
        elif isinstance(current, list | tuple) and isinstance(segment, int):
            if not 0 <= segment < len(current):
                raise UnresolvedReference(
                    f"cannot resolve {format_reference(ref)}: index {segment} is out of range"
                    f" for {where} (length {len(current)})",
                    ref,
                )
            current = current[segment]
        else:
            step = f"[{segment}]" if isinstance(segment, int) else repr(segment)
            raise UnresolvedReference(
                f"cannot resolve {format_reference(ref)}: {where} is"
                f" {_a(json_type_name(current))} and cannot be indexed with {step}",
                ref,
            )
    return current
