"""Published tools: those written with the client's ``@tool`` (docs/tools.md), named
with a dot (``acme.summarize``) so that no built-in name is ever theirs, and checked
against the JSON Schema their package published.

A published tool runs in one of two places: ``fleet`` (a package installed on the Celery
workers, loaded at their start by ``orchestrator.tools.packages``) or ``worker`` (an
organization's ``orch worker``, which takes it as a runner job). The schemas are the
catalogue's (``runs.catalogue``); this module only knows how to read them.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import jsonschema
from jsonschema import ValidationError

from common.tools.base import has_template

# The client's rule (orchestrator_client.tools.definition): dotted and lower case.
NAME_RE = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)+$")
FLEET = "fleet"
WORKER = "worker"
# A worker tool's step may name which workers may take it, as a runner step does.
DEMANDS = "demands"
DEMAND_TEXTS = ("hostname", "project_dir", "executor_type")


def is_published_name(name: str) -> bool:
    return bool(NAME_RE.match(name))


@dataclass(frozen=True)
class ToolSchema:
    """A tool's current version, as a plan's steps are checked against it."""

    name: str
    version: str
    placement: str
    params_schema: dict[str, Any] = field(default_factory=dict)


class Catalogue(Protocol):
    """What an organization may name in a plan besides the built-in tools."""

    def get(self, name: str) -> ToolSchema | None: ...

    def names(self) -> list[str]: ...


def params_problems(tool: ToolSchema, params: dict[str, Any]) -> list[tuple[str, str]]:
    """The step's params against the tool's schema: each problem's path (under
    ``params``) and message. A value that is still a ``${...}`` template is checked when
    rendered (by the tool, which fails with ``invalid_input``)."""
    given = dict(params)
    problems: list[tuple[str, str]] = []
    if tool.placement == WORKER and DEMANDS in given:
        problems += demands_problems(given.pop(DEMANDS))
    validator = jsonschema.Draft202012Validator(tool.params_schema)
    for error in sorted(validator.iter_errors(given), key=lambda e: list(e.absolute_path)):
        problems += [(_path(e), _message(e)) for e in _leaves(error) if not _templated(e)]
    return problems


def demands_problems(demands: Any) -> list[tuple[str, str]]:
    """``demands``: which workers may take the step (exact hostname, project_dir,
    executor_type; every one of ``tags``)."""
    if has_template(demands):
        return [(DEMANDS, "is chosen when the plan is written, not rendered")]
    if not isinstance(demands, dict):
        return [(DEMANDS, "must be an object (hostname, project_dir, executor_type, tags)")]
    problems = [
        (f"{DEMANDS}.{key}", "is not a demand")
        for key in sorted(set(demands) - {*DEMAND_TEXTS, "tags"})
    ]
    for key in DEMAND_TEXTS:
        if key in demands and not isinstance(demands[key], str):
            problems.append((f"{DEMANDS}.{key}", "must be a string"))
    tags = demands.get("tags", [])
    if not isinstance(tags, list) or not all(isinstance(tag, str) for tag in tags):
        problems.append((f"{DEMANDS}.tags", "must be a list of strings"))
    return problems


def _leaves(error: ValidationError) -> Iterator[ValidationError]:
    """The most precise errors: a failed ``anyOf`` (an optional object, say) is reported
    by its branch's errors when exactly one branch had the value's type."""
    typed = [e for e in error.context or [] if e.validator != "type"]
    if error.validator in ("anyOf", "oneOf") and typed:
        for sub in typed:
            yield from _leaves(sub)
        return
    yield error


def _templated(error: ValidationError) -> bool:
    return has_template(error.instance)


def _path(error: ValidationError) -> str:
    path = ""
    for part in error.absolute_path:
        path = f"{path}[{part}]" if isinstance(part, int) else (f"{path}.{part}" if path else part)
    if error.validator == "required" and isinstance(error.validator_value, list):
        missing = [name for name in error.validator_value if name not in (error.instance or {})]
        if missing:
            return f"{path}.{missing[0]}" if path else str(missing[0])
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        allowed = set((error.schema.get("properties") or {}).keys())
        extra = sorted(set(error.instance) - allowed)
        if extra:
            return f"{path}.{extra[0]}" if path else extra[0]
    return path


def _message(error: ValidationError) -> str:
    if error.validator == "required":
        return "is required"
    if error.validator == "additionalProperties":
        return "is not a parameter of the tool" if not error.absolute_path else "is not a field"
    if error.validator == "type":
        return f"must be of type {_types(error.validator_value)}, got {_shown(error.instance)}"
    if error.validator == "enum":
        return f"must be one of {_listed(error.validator_value)}, got {_shown(error.instance)}"
    return str(error.message)


def _types(value: Any) -> str:
    return " or ".join(value) if isinstance(value, list) else str(value)


def _listed(values: Any) -> str:
    return ", ".join(_shown(v) for v in values)


def _shown(value: Any) -> str:
    if isinstance(value, str):
        return repr(value) if len(value) <= 40 else repr(value[:40] + "...")
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "an array"
    return "null" if value is None else repr(value)
