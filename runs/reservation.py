"""What a run reserves when it starts: its plan's `credits`, or the worst case of its steps
priced by billing (``billing.pricing``)."""

from __future__ import annotations

from collections.abc import Iterable
from decimal import Decimal

from billing.pricing import attempt_estimate, minimum_reservation
from runs.plan import AgentPlan, Plan, StepPlan

# A task or agent whose failure mode is `retry` may run its children 1 + 3 times.
LEVEL_RUNS = 4


def _step_estimate(step: StepPlan) -> Decimal:
    handlers = sum(
        (_step_estimate(handler) for handler in (*step.on_error, *step.on_callback)), Decimal(0)
    )
    return attempt_estimate(step.tool) * step.retry.max_attempts + handlers


def plan_reservation(plan: Plan) -> Decimal:
    """The plan's `credits`, or the worst case of its steps: every attempt of every step
    used, in every level retry its task and agent may make."""
    if plan.credits is not None:
        return plan.credits
    return max(agents_reservation(plan.agents), minimum_reservation())


def agents_reservation(agents: Iterable[AgentPlan]) -> Decimal:
    """The worst case of these agents' steps (a re-plan reserves this for its agents)."""
    total = Decimal(0)
    for agent in agents:
        agent_runs = LEVEL_RUNS if agent.failure_mode == "retry" else 1
        for task in agent.tasks:
            task_runs = LEVEL_RUNS if task.failure_mode == "retry" else 1
            steps = sum((_step_estimate(step) for step in task.steps), Decimal(0))
            total += steps * agent_runs * task_runs
    return total
