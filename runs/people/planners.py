"""Planners: what a re-plan asks for new agents (docs/escalation.md#re-plan).

A planner is a callable named in settings (``ORCH_PLANNERS``; a plan picks one by name,
``ORCH_PLANNER`` otherwise). It is given a ``PlanningRequest`` (the run's plan, what
failed, the limits) and returns new agents as plan JSON (a fragment: a list of agents,
each as a plan writes it), or nothing (``None`` or an empty list), or a ``Proposal``
with its token usage. It may raise ``PlanningFailed``; anything else it raises is
recorded the same way. Its answer is never trusted: ``runs.people.replanning`` puts it through
the plan validator with the rest of the plan before anything is spawned.

The rule-based planner and the lookup by name live here; the LLM planner, which speaks
HTTP, lives with the other outbound calls in ``orchestrator.llm_planner``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.utils.module_loading import import_string

from runs.plan import Limits
from runs.plan.fields import NAME_MAX_LENGTH

AgentJson = dict[str, Any]


@dataclass(frozen=True)
class PlanningRequest:
    """What a planner is told. ``plan``: the run's plan as submitted, its agents followed
    by those earlier re-plans added; ``failures``: ``{"agents", "tasks", "steps"}``, each
    entry naming what failed with its `code` and `message`; ``agents``: every agent of
    the running attempt with its status; ``limits``: what a fragment may add."""

    run_id: str
    replan: int  # this re-plan's number, 1 for the first
    trigger: str  # agents_failed, tasks_failed or operator
    plan: dict[str, Any]
    failures: dict[str, Any]
    agents: list[dict[str, str]]
    limits: dict[str, Any]


@dataclass(frozen=True)
class Proposal:
    """A planner's answer with what it cost to make (an LLM's token usage)."""

    agents: list[AgentJson] = field(default_factory=list)
    usage: dict[str, Any] | None = None


class PlanningFailed(Exception):
    """The planner could not answer (``code``: why), or its answer was refused
    (``problems``: the validator's, with paths in the fragment)."""

    def __init__(self, code: str, message: str, problems: Sequence[Mapping[str, str]] = ()) -> None:
        self.code = code
        self.message = message
        self.problems = [dict(problem) for problem in problems]
        super().__init__(message)

    def as_error(self) -> dict[str, Any]:
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.problems:
            error["problems"] = self.problems
        return error


Planner = Callable[[PlanningRequest], "Proposal | Sequence[AgentJson] | None"]


def planner_named(name: str) -> Planner:
    """The planner configured under ``name`` (``ORCH_PLANNERS``)."""
    path = settings.ORCH_PLANNERS.get(name)
    if path is None:
        raise PlanningFailed("planner_error", f"no planner is configured as {name!r}")
    planner: Planner = import_string(path)
    return planner


def proposal_of(answer: Any) -> Proposal:
    """A planner's answer as a Proposal; anything but agents or nothing is refused."""
    if answer is None:
        return Proposal()
    if isinstance(answer, Proposal):
        return answer
    if isinstance(answer, list | tuple):
        return Proposal(list(answer))
    raise PlanningFailed(
        "invalid_plan",
        f"a planner answers a list of agents or nothing, not {type(answer).__name__}",
    )


def limits_for(plan: Mapping[str, Any], limits: Limits, **extra: Any) -> dict[str, Any]:
    """What a fragment may add to ``plan`` within the plan limits."""
    agents = plan.get("agents") or []
    steps = sum(len(task.get("steps", [])) for agent in agents for task in agent.get("tasks", []))
    return {
        "max_new_agents": max(limits.max_agents - len(agents), 0),
        "max_new_steps": max(limits.max_steps_per_run - steps, 0),
        "max_tasks_per_agent": limits.max_tasks_per_agent,
        "max_steps_per_task": limits.max_steps_per_task,
        "max_retry_attempts": limits.max_retry_attempts,
        **extra,
    }


# --------------------------------------------------------------------------- rules
DONE_OR_OPEN = ("completed", "pending", "running", "paused")


def rule_planner(request: PlanningRequest) -> list[AgentJson] | None:
    """Run the failed agents again, once: each agent that failed, or holds a task or step
    that failed, is copied whole under a new name, in `continue` failure mode (agent
    and tasks), with the retry budgets of its failed steps doubled (at least two more
    attempts, within the plan limits). A second re-plan proposes nothing: this planner
    knows one remedy only."""
    if request.replan > 1:
        return None
    failures = request.failures
    failed_agents: list[str] = []
    for entry in (
        *failures.get("agents", []),
        *failures.get("tasks", []),
        *failures.get("steps", []),
    ):
        if entry.get("agent") and entry["agent"] not in failed_agents:
            failed_agents.append(entry["agent"])
    failed_steps = {
        (entry.get("agent"), entry.get("task"), entry.get("step"))
        for entry in failures.get("steps", [])
    }
    by_name = {agent.get("name"): agent for agent in request.plan.get("agents", [])}
    status = {agent["name"]: agent["status"] for agent in request.agents}
    taken = set(by_name) | set(status)
    budget = int(request.limits.get("max_retry_attempts", 10))
    fragment = []
    for name in failed_agents:
        original = by_name.get(name)
        if original is None:
            continue
        agent = copy.deepcopy(original)
        agent["name"] = _fresh_name(name, request.replan, taken)
        taken.add(agent["name"])
        agent["failure_mode"] = "continue"
        # What it waited for has completed or still will; what failed will not.
        kept = [dep for dep in agent.get("depends_on", []) if status.get(dep) in DONE_OR_OPEN]
        if kept:
            agent["depends_on"] = kept
        else:
            agent.pop("depends_on", None)
        for task in agent.get("tasks", []):
            task["failure_mode"] = "continue"
            for step in task.get("steps", []):
                if (name, task.get("name"), step.get("name")) in failed_steps:
                    step["retry"] = _widened(step.get("retry") or {}, budget)
        fragment.append(agent)
    return fragment or None


def _fresh_name(name: str, replan: int, taken: set[str]) -> str:
    suffix = f"-replan{replan}"
    base = name[: NAME_MAX_LENGTH - len(suffix) - 3] + suffix
    candidate, n = base, 2
    while candidate in taken:
        candidate, n = f"{base}-{n}", n + 1
    return candidate


def _widened(retry: Mapping[str, Any], budget: int) -> dict[str, Any]:
    widened = dict(retry)
    attempts = int(retry.get("max_attempts", 3))
    widened["max_attempts"] = min(max(attempts * 2, attempts + 2), budget)
    if "max_failures" in retry:
        failures = int(retry["max_failures"])
        widened["max_failures"] = min(max(failures * 2, failures + 2), widened["max_attempts"])
    widened.pop("on_exhausted", None)  # a second chance fails plainly when it is spent
    return widened
