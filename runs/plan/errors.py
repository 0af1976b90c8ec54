"""A problem with a plan, at its path, and the phrases every message is built from.

Paths read as the plan is written: ``agents[0].tasks[1].depends_on[0]``; the plan itself
is ``""``.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Any

from common.templates import json_type_name


@dataclass(frozen=True)
class PlanError:
    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class PlanInvalid(Exception):
    """The plan has problems; ``errors`` lists all of them. API: 400 `invalid_plan`."""

    code = "invalid_plan"

    def __init__(self, errors: list[PlanError]) -> None:
        self.errors = errors
        super().__init__("; ".join(str(error) for error in errors))


def errors_as_dicts(errors: list[PlanError]) -> list[dict[str, str]]:
    return [{"path": error.path, "message": error.message} for error in errors]


def join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def path_of(location: Iterable[str | int]) -> str:
    """``("agents", 0, "name")`` as ``agents[0].name``."""
    path = ""
    for part in location:
        path = f"{path}[{part}]" if isinstance(part, int) else join(path, str(part))
    return path


def show(value: Any) -> str:
    """A submitted value, short, as the plan's author wrote it."""
    if isinstance(value, str):
        text = repr(value)
    else:
        try:
            text = json.dumps(value, separators=(",", ":"), default=str)
        except (TypeError, ValueError, RecursionError):
            text = json_type_name(value)
    return text if len(text) <= 40 else f"{text[:37]}..."


def a(value: Any) -> str:
    """``a string``, ``an object``, ``null``: what a value is, in a sentence."""
    name = json_type_name(value)
    if name == "null":
        return name
    return f"an {name}" if name[0] in "aeiou" else f"a {name}"


def suggest(word: str, choices: Collection[str]) -> str:
    """``"; did you mean 'x'?"`` for a near miss, else "".

    Only among a few choices: a plan can have thousands of siblings and make thousands
    of mistakes, and each comparison costs.
    """
    if len(choices) > 50 or len(word) > 100:
        return ""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"; did you mean '{close[0]}'?" if close else ""


def listing(names: Collection[str]) -> str:
    return ", ".join(sorted(names)) or "none"
