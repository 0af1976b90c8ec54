"""The plan's limits, and what is refused before the plan is read at all.

A plan nested too deeply, too large, or holding values PostgreSQL cannot store is refused
whole, before any of its fields is looked at: depth is measured first and without
recursion, so that a hostile value never reaches code that recurses (``json.dumps``, the
model's validators).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from django.conf import settings

from common.text import text_problem
from runs.plan.errors import PlanError, join


@dataclass(frozen=True)
class Limits:
    """``settings.ORCHESTRATOR_PLAN_LIMITS``: sizes beyond which a plan is refused."""

    max_spec_bytes: int
    max_agents: int
    max_tasks_per_agent: int
    max_steps_per_task: int
    max_steps_per_run: int
    max_on_error: int
    max_json_depth: int
    max_variables_bytes: int
    max_retry_attempts: int
    max_step_timeout_ms: int

    @classmethod
    def from_settings(cls) -> Limits:
        return cls(**settings.ORCHESTRATOR_PLAN_LIMITS)


def json_depth(value: Any, limit: int) -> int:
    """Nesting depth of a JSON value, stopping early once past ``limit``."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    deepest = 0
    while stack:
        item, depth = stack.pop()
        deepest = max(deepest, depth)
        if deepest > limit:
            return deepest
        if isinstance(item, dict):
            stack.extend((child, depth + 1) for child in item.values())
        elif isinstance(item, list | tuple):
            stack.extend((child, depth + 1) for child in item)
    return deepest


def json_size(value: Any) -> int | None:
    """Bytes of ``value`` as compact UTF-8 JSON; None if it cannot be written as JSON."""
    try:
        text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str)
    except (TypeError, ValueError, RecursionError):
        return None
    return len(text.encode("utf-8", "surrogatepass"))


def unstorable_values(data: Any) -> list[PlanError]:
    """Every string (keys too) PostgreSQL cannot store, and every NaN or infinity, with
    its path. Iterative: the plan's depth is bounded before this runs, not by it."""
    problems: list[PlanError] = []
    stack: list[tuple[str, Any]] = [("", data)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, str):
            problem = text_problem(item)
            if problem:
                problems.append(PlanError(path, problem))
        elif isinstance(item, float):
            if item != item or item in (float("inf"), float("-inf")):
                problems.append(PlanError(path, "NaN and Infinity are not JSON numbers"))
        elif isinstance(item, dict):
            for key, value in reversed(list(item.items())):
                shown = str(key)
                key_problem = text_problem(shown)
                if key_problem:
                    shown = repr(shown).encode("ascii", "backslashreplace").decode()
                    problems.append(PlanError(join(path, shown), f"key {key_problem}"))
                stack.append((join(path, shown), value))
        elif isinstance(item, list | tuple):
            stack.extend(reversed([(f"{path}[{i}]", value) for i, value in enumerate(item)]))
    return problems


def refused_whole(data: Any, limits: Limits, size_hint: int | None) -> list[PlanError]:
    """Why the plan is refused before it is read: too deep, too large, or holding values
    PostgreSQL would refuse at insert; [] when it may be read.

    ``size_hint`` is the request body's size when known, to refuse an oversized plan
    before walking it. Every path that creates a run comes here (API, admin, shell):
    unstorable values are reported like any other problem, not as a database error
    after the fact.
    """
    # Depth first: it is measured without recursion, and a too-deep value must not reach
    # json.dumps (which recurses) when measuring the size.
    if json_depth(data, limits.max_json_depth) > limits.max_json_depth:
        return [PlanError("", f"plan nests deeper than {limits.max_json_depth} levels")]
    size = size_hint if size_hint is not None else json_size(data)
    if size is None:
        return [PlanError("", "plan cannot be written as JSON")]
    if size > limits.max_spec_bytes:
        return [PlanError("", f"plan is {size} bytes; at most {limits.max_spec_bytes} allowed")]
    return unstorable_values(data)
