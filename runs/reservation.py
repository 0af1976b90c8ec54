"""What a run reserves when it starts: its plan's `credits`, or the worst case of its steps
priced by billing (``billing.pricing``)."""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable
from datetime import datetime, timedelta
from decimal import Decimal

from django.utils import timezone

from billing.pricing import attempt_estimate, minimum_reservation, wait_price
from common.tools.base import has_template
from runs.plan import AgentPlan, Plan, StepPlan
from runs.plan.durations import WAIT_MAX_MS, parse_duration_ms

# A task or agent whose failure mode is `retry` may run its children 1 + 3 times.
LEVEL_RUNS = 4


def _step_estimate(step: StepPlan) -> Decimal:
    handlers = sum(
        (_step_estimate(handler) for handler in (*step.on_error, *step.on_callback)), Decimal(0)
    )
    held = wait_price(wait_estimate_ms(step.params)) if step.tool == "wait" else Decimal(0)
    return attempt_estimate(step.tool) * step.retry.max_attempts + held + handlers


def wait_estimate_ms(params: dict[str, object], now: datetime | None = None) -> int:
    """The longest a `wait` step with ``params`` may hold, as its run starts (what it
    reserves; it pays, as it parks, for what is left then, never more): its ``for``; up
    to its ``until`` from ``now``; the longest wait there is (366 days) for a template,
    read only when the step starts. A wait parks once, whatever its retry policy."""
    value = params.get("for", params.get("until"))
    if has_template(value):
        return WAIT_MAX_MS
    if "for" in params:
        return parse_duration_ms(value) or 0
    try:
        until = datetime.fromisoformat(str(value))
    except ValueError:
        return WAIT_MAX_MS  # the plan's check refuses it; nothing less is sure
    if until.tzinfo is None:
        return WAIT_MAX_MS
    return max(0, math.ceil((until - (now or timezone.now())) / timedelta(milliseconds=1)))


def plan_reservation(plan: Plan, reused: Collection[str] = ()) -> Decimal:
    """The plan's `credits`, or the worst case of its steps: every attempt of every step
    used, in every level retry its task and agent may make. ``reused``: the paths of the
    steps that take an earlier output (``Run.reuse``): they run only in a level retry."""
    if plan.credits is not None:
        return plan.credits
    return max(agents_reservation(plan.agents, reused), minimum_reservation())


def agents_reservation(agents: Iterable[AgentPlan], reused: Collection[str] = ()) -> Decimal:
    """The worst case of these agents' steps (a re-plan reserves this for its agents)."""
    total = Decimal(0)
    for agent in agents:
        agent_runs = LEVEL_RUNS if agent.failure_mode == "retry" else 1
        for task in agent.tasks:
            task_runs = LEVEL_RUNS if task.failure_mode == "retry" else 1
            runs = agent_runs * task_runs
            for step in task.steps:
                # A reused step's first run costs nothing; a level retry runs it again.
                path = f"{agent.name}.{task.name}.{step.name}"
                total += _step_estimate(step) * (runs - 1 if path in reused else runs)
    return total
