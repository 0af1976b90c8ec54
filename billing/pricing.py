"""What a step costs and what a run reserves, from the prices in settings."""

from __future__ import annotations

from decimal import Decimal

from django.conf import settings

from runs.spec import Plan, StepPlan


def tool_price(tool: str) -> Decimal:
    prices: dict[str, str] = settings.BILLING_TOOL_PRICES
    return Decimal(prices.get(tool, settings.BILLING_DEFAULT_TOOL_PRICE))


def llm_cost(total_tokens: int) -> Decimal:
    return Decimal(settings.BILLING_LLM_PRICE_PER_1K_TOKENS) * Decimal(total_tokens) / 1000


def _step_estimate(step: StepPlan) -> Decimal:
    per_attempt = (
        Decimal(settings.BILLING_LLM_ESTIMATE) if step.tool == "llm" else tool_price(step.tool)
    )
    handlers = sum((_step_estimate(handler) for handler in step.on_error), Decimal(0))
    return per_attempt * step.retry.max_attempts + handlers


# A task or agent whose failure mode is `retry` may run its children 1 + 3 times.
LEVEL_RUNS = 4


def plan_reservation(plan: Plan) -> Decimal:
    """The plan's `credits`, or the worst case of its steps: every attempt of every step
    used, in every level retry its task and agent may make."""
    if plan.credits is not None:
        return plan.credits
    total = Decimal(0)
    for agent in plan.agents:
        agent_runs = LEVEL_RUNS if agent.failure_mode == "retry" else 1
        for task in agent.tasks:
            task_runs = LEVEL_RUNS if task.failure_mode == "retry" else 1
            steps = sum((_step_estimate(step) for step in task.steps), Decimal(0))
            total += steps * agent_runs * task_runs
    return max(total, Decimal(settings.BILLING_MIN_RESERVATION))
