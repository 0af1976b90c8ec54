"""Prices (docs/configuration.md, "Billing")."""

from __future__ import annotations

from config.settings.environment import env

# --------------------------------------------------------------------------- billing
# Price of one step attempt per tool, in credits; a run without `credits` in its plan
# reserves the sum over its steps of price x max_attempts (handlers included), at least
# BILLING_MIN_RESERVATION. LLM steps are charged by tokens instead (price per 1k tokens)
# and reserve BILLING_LLM_ESTIMATE each.
BILLING_TOOL_PRICES = {
    "noop": "0.01",
    "echo": "0.01",
    "sleep": "0.01",
    # A durable wait is priced by the day it holds (BILLING_WAIT_PRICE_PER_DAY), not here.
    "wait": "0.00",
    "fail": "0.01",
    "http": "0.10",
    "python": "0.05",
    "llm": "0.00",
    "approval": "0.00",
    "runner": "0.50",
    "run": "0.00",
}
BILLING_DEFAULT_TOOL_PRICE = "0.01"
BILLING_LLM_PRICE_PER_1K_TOKENS = env.string(
    "BILLING_LLM_PRICE_PER_1K_TOKENS", "0.02", "credits charged per 1,000 LLM tokens"
)
BILLING_LLM_ESTIMATE = env.string(
    "BILLING_LLM_ESTIMATE", "5", "credits reserved per LLM step when the plan gives no credits"
)
BILLING_MIN_RESERVATION = "0.01"
# A `wait` step's time held: charged when it parks, per started day of its wait
# (docs/api.md, "Waits"); what a plan reserves for it is that of its longest wait.
BILLING_WAIT_PRICE_PER_DAY = env.string(
    "BILLING_WAIT_PRICE_PER_DAY", "0.01", "credits charged per started day a wait step holds"
)
