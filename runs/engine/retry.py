"""A step's retry policy: whether a failed attempt is retried, and after how long.

Budgets: ``max_attempts`` bounds how many times the step is
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
    # The policy asks for people instead (runs.engine.policy): backoff_exceeded (a retry
    # whose backoff would pass max_delay_ms) or attempts_exhausted (on_exhausted).
    escalate: str = ""


def backoff_ms(
    policy: RetryPolicy | Mapping[str, Any], failures: int, rand: random.Random | None = None
) -> int:
    """Delay before the next attempt after ``failures`` failed attempts (1-based).

    fixed: base; linear: base x failures; exponential: base x multiplier^(failures-1);
    then capped at max_delay_ms and spread by +/- jitter (a fraction of the delay).
    """
    policy = _typed(policy)
    delay = min(uncapped_ms(policy, failures), float(policy.max_delay_ms))
    if policy.jitter:
        delay += delay * policy.jitter * (2 * (rand or random).random() - 1)
    return max(0, int(delay))


def uncapped_ms(policy: RetryPolicy, failures: int) -> float:
    """The backoff before its cap and jitter: fixed, linear or exponential."""
    base = float(policy.base_delay_ms)
    if policy.backoff == "fixed":
        return base
    if policy.backoff == "linear":
        return base * failures
    try:
        return base * policy.multiplier ** (failures - 1)
    except OverflowError:
        return float("inf")


def decide(
    policy: RetryPolicy | Mapping[str, Any],
    *,
    code: str,
    retryable: bool,
    attempts: int,
    failures: int,
) -> Decision:
    """What to do after a failed attempt. ``attempts`` and ``failures`` include it (and
    count from the step's budget base: an escalation resumed starts them afresh).

    In order: not retryable -> fail; budgets spent -> fail, or escalate when the
    policy says `on_exhausted: escalate`; a backoff beyond a `max_delay_ms` the plan
    wrote -> escalate instead of capping it; else retry after the backoff."""
    policy = _typed(policy)
    if not retryable or (policy.retry_on and code not in policy.retry_on):
        return Decision(False, code=code)
    exhausted = policy.on_exhausted == "escalate"
    if attempts >= policy.max_attempts:
        return Decision(
            False, code="attempt_budget_exhausted", escalate=_if(exhausted, "attempts_exhausted")
        )
    if failures >= policy.max_failures:
        return Decision(
            False, code="failure_budget_exhausted", escalate=_if(exhausted, "attempts_exhausted")
        )
    delay = backoff_ms(policy, failures)
    if policy.caps_escalate and uncapped_ms(policy, failures) > policy.max_delay_ms:
        return Decision(True, delay_ms=delay, escalate="backoff_exceeded")
    return Decision(True, delay_ms=delay)


def _if(condition: bool, reason: str) -> str:
    return reason if condition else ""


def _typed(policy: RetryPolicy | Mapping[str, Any]) -> RetryPolicy:
    # A step row stores the policy as JSON; its defaults are the plan's (runs.plan).
    return policy if isinstance(policy, RetryPolicy) else RetryPolicy.from_dict(policy)
