"""What a step costs, from the prices in settings (a run's reservation is computed from
these by ``runs.reservation``)."""

from __future__ import annotations

import math
from decimal import Decimal

from django.conf import settings


def tool_price(tool: str) -> Decimal:
    prices: dict[str, str] = settings.BILLING_TOOL_PRICES
    return Decimal(prices.get(tool, settings.BILLING_DEFAULT_TOOL_PRICE))


def llm_cost(total_tokens: int) -> Decimal:
    return Decimal(settings.BILLING_LLM_PRICE_PER_1K_TOKENS) * Decimal(total_tokens) / 1000


def attempt_estimate(tool: str) -> Decimal:
    """What one attempt of a step of ``tool`` is expected to cost, before it runs: its
    price, or for `llm` (priced by tokens afterwards) BILLING_LLM_ESTIMATE."""
    return Decimal(settings.BILLING_LLM_ESTIMATE) if tool == "llm" else tool_price(tool)


DAY_MS = 86_400_000


def wait_price(length_ms: int) -> Decimal:
    """What a `wait` step pays for holding its place ``length_ms``: BILLING_WAIT_PRICE_PER_DAY
    per started day (a wait of 20 minutes pays one day, of 25 hours two); nothing for
    none. Charged when it parks (``runs.admission.step_admission.timer``)."""
    days = math.ceil(max(length_ms, 0) / DAY_MS)
    return Decimal(settings.BILLING_WAIT_PRICE_PER_DAY) * days


def minimum_reservation() -> Decimal:
    return Decimal(settings.BILLING_MIN_RESERVATION)
