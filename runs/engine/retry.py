"""A step's retry policy: whether a failed attempt is retried, and after how long.

Budgets (seeds 000, 002, 003): ``max_attempts`` bounds how many times the step is
claimed, ``max_failures`` how many attempts may fail; whichever runs out first ends the
step FAILED with `attempt_budget_exhausted` or `failure_budget_exhausted`. Only
retryable codes are retried, narrowed to ``retry_on`` when the plan lists codes.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from runs.plan import RetryPolicy


@dataclass(frozen=True)
class Decision:
    retry: bool
    delay_ms: int = 0
    code: str = ""  # the failure code when not retried


def backoff_ms(
    policy: RetryPolicy | Mapping[str, Any], failures: int, rand: random.Random | None = None
) -> int:
    """Delay before the next attempt after ``failures`` failed attempts (1-based).

    fixed: base; linear: base x failures; exponential: base x multiplier^(failures-1);
    then capped at max_delay_ms and spread by +/- jitter (a fraction of the delay).
    """
    policy = _typed(policy)
    base = float(policy.base_delay_ms)
    if policy.backoff == "fixed":
        delay = base
    elif policy.backoff == "linear":
        delay = base * failures
    else:
        delay = base * policy.multiplier ** (failures - 1)
    delay = min(delay, float(policy.max_delay_ms))
    if policy.jitter:
        delay += delay * policy.jitter * (2 * (rand or random).random() - 1)
    return max(0, int(delay))


def decide(
    policy: RetryPolicy | Mapping[str, Any],
    *,
    code: str,
    retryable: bool,
    attempts: int,
    failures: int,
) -> Decision:
    """What to do after a failed attempt. ``attempts`` and ``failures`` include it."""
    policy = _typed(policy)
    if not retryable or (policy.retry_on and code not in policy.retry_on):
        return Decision(False, code=code)
    if attempts >= policy.max_attempts:
        return Decision(False, code="attempt_budget_exhausted")
    if failures >= policy.max_failures:
        return Decision(False, code="failure_budget_exhausted")
    return Decision(True, delay_ms=backoff_ms(policy, failures))


def _typed(policy: RetryPolicy | Mapping[str, Any]) -> RetryPolicy:
    # A step row stores the policy as JSON; its defaults are the plan's (runs.plan).
    return policy if isinstance(policy, RetryPolicy) else RetryPolicy.from_dict(policy)
