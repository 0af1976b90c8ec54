"""The run's plan: ``parse_plan`` and the typed plan it returns.

``parse_plan(data)`` checks a submitted plan completely before anything is stored or
reserved and reports *every* problem at once, each with its path
(``agents[0].tasks[1].depends_on[0]: unknown task 'gahter'``), in three passes:

1. what is refused whole, before the plan is read: nested too deeply, too large, text
   PostgreSQL cannot store, NaN (``runs.plan.guard``);
2. the structure: every field's type and constraint, unknown fields (a typo must not be
   silently ignored), missing ones, by the plan's model (``runs.plan.model``), which is
   also the typed plan and the source of the OpenAPI ``Plan`` schema;
3. the whole plan, whatever the second pass found: unknown tools, duplicate names,
   dangling dependencies, cycles, templates and conditions, references to work that
   cannot have finished yet, the steps' total (``runs.plan.checks``).

Whatever JSON-like value it is given, ``parse_plan`` either returns a plan or raises
``PlanInvalid``: a wrong type anywhere is a reported problem, never a crash.

On success it returns a :class:`Plan` with every default filled in; the stored plan
(``Run.plan``) stays exactly as submitted, and the typed plan is derived from it again
when a worker materialises the run. Callers import the plan's names from here; the
modules of this package are its parts:

- ``model``: the plan as pydantic models. They validate a submitted plan's shape, they are
  the typed plan the engine reads, and the OpenAPI ``Plan`` schema is generated from them.
- ``fields``: the field types those models are declared with: each states its constraint
  once, for validation and for the schema, and says in the plan's words what it refuses.
- ``checks``: what the whole plan must satisfy beyond each field's shape: known tools,
  unique names, dependencies and cycles, templates, conditions, the steps' total.
- ``graph``: dependency cycles, and what is guaranteed to have finished before a child.
- ``guard``: the limits, and what is refused before the plan is read (depth, size, text
  PostgreSQL cannot store, NaN).
- ``durations``: ``"30s"`` and friends, in milliseconds: the one reading of every
  duration a plan holds, its own fields' and its tools' duration parameters alike.
- ``errors``: a problem with its path, and the phrases messages are built from.
"""

from __future__ import annotations

from typing import Any

from common.tools.published import Catalogue
from runs.plan.checks import check_plan
from runs.plan.durations import (
    DurationRefused,
    format_duration_ms,
    parse_duration_ms,
    read_duration_ms,
    seconds_ms,
)
from runs.plan.errors import PlanError, PlanInvalid, errors_as_dicts
from runs.plan.guard import Limits, json_depth, json_size, refused_whole
from runs.plan.model import (
    AgentPlan,
    EscalationPolicy,
    HandlerPlan,
    Plan,
    ReplanPolicy,
    RetryPolicy,
    StepPlan,
    TaskPlan,
    Timeouts,
    read_plan,
)

__all__ = [
    "AgentPlan",
    "DurationRefused",
    "EscalationPolicy",
    "HandlerPlan",
    "Limits",
    "Plan",
    "PlanError",
    "PlanInvalid",
    "ReplanPolicy",
    "RetryPolicy",
    "StepPlan",
    "TaskPlan",
    "Timeouts",
    "errors_as_dicts",
    "format_duration_ms",
    "json_depth",
    "json_size",
    "parse_duration_ms",
    "parse_plan",
    "read_duration_ms",
    "seconds_ms",
]


def parse_plan(
    data: Any,
    *,
    limits: Limits | None = None,
    size_hint: int | None = None,
    tools: Catalogue | None = None,
) -> Plan:
    """Validate a submitted plan; return the typed plan or raise ``PlanInvalid``.

    ``size_hint`` is the request body's size when known, to refuse oversized plans
    before walking them. ``tools``: the published tools the plan may name, with their
    schemas (``runs.catalogue``); without, their names pass unchecked (a plan read
    again after it was checked).
    """
    limits = limits or Limits.from_settings()
    refused = refused_whole(data, limits, size_hint)
    if refused:
        raise PlanInvalid(refused)
    plan, problems = read_plan(data, limits)
    problems += check_plan(data, limits, tools)
    if problems or plan is None:
        raise PlanInvalid(problems)
    return plan
