"""Plan files as written, wrapped into the body ``POST /api/v1/runs`` takes.

A plan file holds the plan itself, JSON or YAML. The client does not parse it: the text
goes to the API inside ``{plan, start}`` (YAML as ``application/yaml``), and the API
validates it like any body, with the same error codes and paths (``invalid_json``,
``invalid_yaml``, ``invalid_plan``). Only what stops the text from being wrapped is
refused here (``PlanFileError``): a file that cannot be read, is not UTF-8, is empty, or
holds several YAML documents.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

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
    return f'{{"start": {"true" if start else "false"}, "plan": {text.strip()}\n}}'


def yaml_body(text: str, *, start: bool) -> str:
    """The YAML document under ``plan:``, every line indented two more spaces (which
    keeps its structure, block scalars included), then ``start:``."""
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
    return f"start: {'true' if start else 'false'}\nplan:\n{indented}\n"


def _is_document_start(line: str) -> bool:
    return line == "---" or line.startswith(("--- ", "---\t"))


def _content_index(lines: list[str]) -> int | None:
    """The first line that is neither blank nor a comment."""
    return next(
        (i for i, line in enumerate(lines) if line.strip() and not line.startswith("#")), None
    )
