"""The retry decision reads a step's stored policy with the plan's defaults, one set of them."""

from __future__ import annotations

import random

from runs.engine.retry import backoff_ms, decide
from runs.plan import RetryPolicy, parse_plan
from tests.factories import plan


def stored_policy() -> dict[str, object]:
    """The retry policy of a plan step that says nothing about retries, as stored."""
    parsed = parse_plan(plan(steps=1))
    return parsed.agents[0].tasks[0].steps[0].retry.as_dict()


def test_a_stored_policy_reads_back_as_the_plan_parsed_it() -> None:
    stored = stored_policy()

    assert RetryPolicy.from_dict(stored).as_dict() == stored


def test_a_missing_key_takes_the_plans_default_not_another() -> None:
    # Jitter was 0.0 here while the plan's default is 0.1.
    assert RetryPolicy.from_dict({}).jitter == stored_policy()["jitter"] == 0.1
    # As the validator: the failure budget defaults to the attempt budget.
    assert RetryPolicy.from_dict({"max_attempts": 5}).max_failures == 5


def test_backoff_spreads_by_the_default_jitter() -> None:
    delays = {backoff_ms({"backoff": "fixed"}, 1, random.Random(seed)) for seed in range(20)}

    assert len(delays) > 1
    assert all(90 <= delay <= 110 for delay in delays)  # 100 ms +/- 10 %


def test_decide_applies_both_budgets_and_retry_on() -> None:
    policy = {"max_attempts": 3, "max_failures": 2, "retry_on": ["timeout"]}

    assert decide(policy, code="timeout", retryable=True, attempts=1, failures=1).retry
    assert not decide(policy, code="http_error", retryable=True, attempts=1, failures=1).retry
    exhausted = decide(policy, code="timeout", retryable=True, attempts=2, failures=2)
    assert exhausted.code == "failure_budget_exhausted"
    assert decide(policy, code="timeout", retryable=True, attempts=3, failures=1).code == (
        "attempt_budget_exhausted"
    )
