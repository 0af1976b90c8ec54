"""Plan files as written, wrapped into the body ``POST /api/v1/runs`` takes (or ``POST
/api/v1/schedules``, with a schedule's fields beside the plan).

A plan file holds the plan itself, JSON or YAML. The client does not parse it: the text
goes to the API inside ``{plan, start}`` (YAML as ``application/yaml``), and the API
validates it like any body, with the same error codes and paths (``invalid_json``,
``invalid_yaml``, ``invalid_plan``). Only what stops the text from being wrapped is
refused here (``PlanFileError``): a file that cannot be read, is not UTF-8, is empty, or
holds several YAML documents.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

PlanFormat = Literal["json", "yaml"]
YAML_SUFFIXES = (".yaml", ".yml")


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
    /runs`` (``start``) or ``POST /schedules`` (``name``, ``cron``...)."""
    before = "".join(f"{json.dumps(name)}: {json.dumps(value)}, " for name, value in fields.items())
    return f'{{{before}"plan": {text.strip()}\n}}'


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
        del lines[first]
        first = _content_index(lines)
    if first is not None and _is_document_start(lines[first]):
        lines[first] = lines[first][3:].strip()
    while lines and lines[-1].strip() in ("", "..."):
        lines.pop()
    if any(_is_document_start(line) for line in lines):
        raise PlanFileError("the YAML file holds several documents; a plan is one document")
    indented = "\n".join(f"  {line}" if line.strip() else "" for line in lines)
    head = "".join(f"{name}: {yaml_flow(value)}\n" for name, value in fields.items())
    return f"{head}plan:\n{indented}\n"


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
