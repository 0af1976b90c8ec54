"""A step's retry policy: whether a failed attempt is retried, and after how long.

Budgets (seeds 000, 002, 003): ``max_attempts`` bounds how many times the step is
claimed, ``max_failures`` how many attempts may fail; whichever runs out first ends the
step FAILED with `attempt_budget_exhausted` or `failure_budget_exhausted`. Only
retryable codes are retried, narrowed to ``retry_on`` when the plan lists codes.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Decision:
    retry: bool
    delay_ms: int = 0
    code: str = ""  # the failure code when not retried


def backoff_ms(policy: dict[str, Any], failures: int, rand: random.Random | None = None) -> int:
    """Delay before the next attempt after ``failures`` failed attempts (1-based).

    fixed: base; linear: base x failures; exponential: base x multiplier^(failures-1);
    then capped at max_delay_ms and spread by +/- jitter (a fraction of the delay).
    """
    base = float(policy.get("base_delay_ms", 100))
    cap = float(policy.get("max_delay_ms", 30_000))
    kind = policy.get("backoff", "exponential")
    if kind == "fixed":
        delay = base
    elif kind == "linear":
        delay = base * failures
    else:
        delay = base * float(policy.get("multiplier", 2.0)) ** (failures - 1)
    delay = min(delay, cap)
    jitter = float(policy.get("jitter", 0.0))
    if jitter:
        delay += delay * jitter * (2 * (rand or random).random() - 1)
    return max(0, int(delay))


def decide(
    policy: dict[str, Any], *, code: str, retryable: bool, attempts: int, failures: int
) -> Decision:
    """What to do after a failed attempt. ``attempts`` and ``failures`` include it."""
    retry_on = policy.get("retry_on") or []
    if not retryable or (retry_on and code not in retry_on):
        return Decision(False, code=code)
    if attempts >= int(policy.get("max_attempts", 3)):
        return Decision(False, code="attempt_budget_exhausted")
    if failures >= int(policy.get("max_failures", policy.get("max_attempts", 3))):
        return Decision(False, code="failure_budget_exhausted")
    return Decision(True, delay_ms=backoff_ms(policy, failures))
