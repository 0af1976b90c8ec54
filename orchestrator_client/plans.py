"""Plan files as written, wrapped into the body ``POST /api/v1/runs`` takes (or ``POST
/api/v1/schedules``, with a schedule's fields beside the plan).

A plan file holds the plan itself, JSON or YAML. The client does not parse it: the text
goes to the API inside ``{plan, start}`` (YAML as ``application/yaml``), and the API
validates it like any body, with the same error codes and paths (``invalid_json``,
``invalid_yaml``, ``invalid_plan``). Only what stops the text from being wrapped is
refused here (``PlanFileError``): a file that cannot be read, is not UTF-8, is empty, or
holds several YAML documents.

The API's parser reads the wrapped body, so the lines and columns of its ``invalid_json``
and ``invalid_yaml`` messages count from the body's start: ``at_plan_positions`` reads
them back as the file's own (the client does, before raising).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

PlanFormat = Literal["json", "yaml"]
YAML_SUFFIXES = (".yaml", ".yml")
# What yaml_body_with puts before each line of the plan, under `plan:`.
YAML_INDENT = "  "


class PlanFileError(Exception):
    """The plan file cannot be read or wrapped (nothing was sent)."""


@dataclass(frozen=True)
class PlanFile:
    text: str
    format: PlanFormat

    @classmethod
    def read(cls, path: Path) -> PlanFile:
        try:
            raw = path.read_bytes()
        except OSError as exc:
            raise PlanFileError(f"cannot read {path}: {exc.strerror or exc}") from exc
        return cls.parse(raw, name=str(path))

    @classmethod
    def parse(cls, raw: bytes, *, name: str) -> PlanFile:
        try:
            text = raw.decode("utf-8-sig")  # a byte order mark is not part of the plan
        except UnicodeDecodeError as exc:
            raise PlanFileError(f"{name} is not UTF-8 text: {exc.reason}") from exc
        if not text.strip():
            raise PlanFileError(f"{name} is empty")
        return cls(text=text, format=guess_format(name, text))


def guess_format(name: str, text: str) -> PlanFormat:
    """By the name's suffix; otherwise JSON when the text starts with ``{``."""
    lowered = name.lower()
    if lowered.endswith(YAML_SUFFIXES):
        return "yaml"
    if lowered.endswith(".json"):
        return "json"
    return "json" if text.lstrip().startswith("{") else "yaml"


def json_body(text: str, *, start: bool) -> str:
    """``{"plan": <the text as it is>, "start": ...}``: valid JSON exactly when the text
    is; the API says where it is not."""
    return json_body_with(text, {"start": start})


def json_body_with(text: str, fields: Mapping[str, Any]) -> str:
    """``fields`` as JSON, then ``"plan": <the text as it is>``: the body of ``POST
    /runs`` (``start``) or ``POST /schedules`` (``name``, ``cron``...). The text is
    kept whole, its leading and trailing blanks too, so that a position in it is the
    same in the body (shifted along its first line by the head)."""
    return f"{json_head(fields)}{text}}}"


def json_head(fields: Mapping[str, Any]) -> str:
    """What ``json_body_with`` writes before the plan's text, on the plan's first line."""
    before = "".join(f"{json.dumps(name)}: {json.dumps(value)}, " for name, value in fields.items())
    return f'{{{before}"plan": '


def yaml_body(text: str, *, start: bool) -> str:
    """The YAML document under ``plan:``, every line indented two more spaces (which
    keeps its structure, block scalars included), then ``start:``."""
    return yaml_body_with(text, {"start": start})


def yaml_body_with(text: str, fields: Mapping[str, Any]) -> str:
    """``fields``, one per line, each value written as JSON (which YAML reads as the same
    value), then the YAML document under ``plan:`` as ``yaml_body`` puts it."""
    lines = text.splitlines()
    # Directives (%YAML) and the markers that open (---) and close (...) the document
    # belong to the file, not to the plan.
    first = _content_index(lines)
    while first is not None and lines[first].startswith("%"):
        lines[first] = ""  # blank, not removed: the plan's line N stays the body's N + head
        first = _content_index(lines)
    if first is not None and _is_document_start(lines[first]):
        lines[first] = lines[first][3:].strip()
    while lines and lines[-1].strip() in ("", "..."):
        lines.pop()
    if any(_is_document_start(line) for line in lines):
        raise PlanFileError("the YAML file holds several documents; a plan is one document")
    indented = "\n".join(f"{YAML_INDENT}{line}" if line.strip() else "" for line in lines)
    head = "".join(f"{name}: {yaml_flow(value)}\n" for name, value in fields.items())
    return f"{head}plan:\n{indented}\n"


def yaml_head_lines(fields: Mapping[str, Any]) -> int:
    """How many lines ``yaml_body_with`` writes before the plan's first: one per field,
    and ``plan:``."""
    return len(fields) + 1


# PyYAML's position of a problem ("line 5, column 9", counted from 1), and the two lines
# it quotes after it (the line, then a caret under the column), indented by 4.
_YAML_MARK = re.compile(r'in "<unicode string>", line (\d+), column (\d+)')
_YAML_QUOTE_INDENT = 4
# The stdlib's: "line 1 column 30 (char 29)".
_JSON_MARK = re.compile(r"line (\d+) column (\d+) \(char (\d+)\)")


def at_plan_positions(message: str, *, format: PlanFormat, fields: Mapping[str, Any]) -> str:
    """An ``invalid_yaml`` or ``invalid_json`` message about a body the client wrapped
    (``yaml_body_with``, ``json_body_with`` with ``fields``), its lines and columns read
    back as the plan's own, as a parser of the file alone would give them."""
    if format == "json":
        return _JSON_MARK.sub(lambda found: _json_position(found, len(json_head(fields))), message)
    offset = yaml_head_lines(fields)
    lines = message.split("\n")
    written: list[str] = []
    index = 0
    while index < len(lines):
        line = lines[index]
        index += 1
        found = _YAML_MARK.search(line)
        if found is None or int(found.group(1)) <= offset:
            written.append(line)
            continue
        column = int(found.group(2))
        if column > len(YAML_INDENT):
            column -= len(YAML_INDENT)
        number = int(found.group(1)) - offset
        written.append(
            f"{line[: found.start()]}in the plan, line {number}, column {column}"
            f"{line[found.end() :]}"
        )
        # The quoted line and its caret, without the indent the wrapping added (a quote
        # PyYAML shortened, or a blank line, is left as it is).
        quoted = lines[index : index + 2]
        margin = " " * (_YAML_QUOTE_INDENT + len(YAML_INDENT))
        if len(quoted) == 2 and all(q.startswith(margin) for q in quoted):
            cut = slice(_YAML_QUOTE_INDENT, _YAML_QUOTE_INDENT + len(YAML_INDENT))
            written.extend(q[: cut.start] + q[cut.stop :] for q in quoted)
            index += 2
    return "\n".join(written)


def _json_position(found: re.Match[str], head: int) -> str:
    line, column, char = (int(group) for group in found.groups())
    if line == 1:
        column = max(column - head, 1)
    return f"line {line} column {column} (char {max(char - head, 0)})"


def yaml_flow(value: Any) -> str:
    """A JSON value in YAML's flow style, text in double quotes with every character
    outside printable ASCII escaped as YAML escapes it (``\\U0001F600`` beyond the
    first plane, where JSON's surrogate pairs would read as two characters)."""
    if isinstance(value, str):
        return '"' + "".join(_yaml_char(char) for char in value) + '"'
    if isinstance(value, Mapping):
        items = (f"{yaml_flow(str(key))}: {yaml_flow(item)}" for key, item in value.items())
        return "{" + ", ".join(items) + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(yaml_flow(item) for item in value) + "]"
    return json.dumps(value)


def _yaml_char(char: str) -> str:
    if char in ('"', "\\"):
        return "\\" + char
    code = ord(char)
    if 0x20 <= code < 0x7F:
        return char
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def _is_document_start(line: str) -> bool:
    return line == "---" or line.startswith(("--- ", "---\t"))


def _content_index(lines: list[str]) -> int | None:
    """The first line that is neither blank nor a comment."""
    return next(
        (i for i, line in enumerate(lines) if line.strip() and not line.startswith("#")), None
    )


@runtime_checkable
class BuiltPlan(Protocol):
    """A plan built in Python (``orchestrator_client.tools.plan.Plan``): what it gives
    is the plan as JSON data."""

    def to_dict(self) -> dict[str, Any]: ...


PlanData = Mapping[str, Any] | BuiltPlan


def plan_data(plan: PlanData) -> dict[str, Any]:
    """A plan to send: a dict as it is, a built plan as its ``to_dict()``."""
    return plan.to_dict() if isinstance(plan, BuiltPlan) else dict(plan)
