"""Any JSON value, and any JSON shaped like a plan, gives a plan or PlanInvalid, never
another exception (runs/plan/, by Hypothesis)."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runs.plan import Plan, PlanInvalid, parse_plan
from tests.runs.plans import json_values, plan_values


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(json_values, plan_values))
def test_any_json_input_gives_a_plan_or_plan_invalid(data: Any) -> None:
    outcome: Plan | PlanInvalid
    try:
        outcome = parse_plan(data)
    except PlanInvalid as exc:  # anything else fails the test
        outcome = exc
    if isinstance(outcome, PlanInvalid):
        assert outcome.errors
        assert all(isinstance(e.path, str) and e.message for e in outcome.errors)
    else:
        assert outcome.step_count >= 1
