"""The plan's model (runs/plan/model.py) as the typed plan: what code builds and reads.

Validation itself is tests/runs/test_plan_*.py's; the schema's agreement with it is
tests/api/test_plan_schema.py's.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from runs.models import FailureMode, Mode
from runs.plan import HandlerPlan, PlanInvalid, RetryPolicy, StepPlan, parse_plan
from runs.plan.model import FAILURE_MODES, MODES
from tests.runs.plans import json_values, one_step, plan_values, the_step, valid

# pydantic's own wording, which a plan's author must never see.
PYDANTIC_PHRASES = ("Input should", "Field required", "Extra inputs", "validation error")


def test_the_plans_modes_are_the_rows_choices() -> None:
    assert tuple(Mode.values) == MODES
    assert tuple(FailureMode.values) == FAILURE_MODES


def test_a_handler_kept_on_its_step_row_is_read_back_as_it_was_planned() -> None:
    handler = the_step(
        valid(
            one_step(
                on_error=[{"name": "h", "tool": "echo", "params": {"text": "x"}, "timeout": "2s"}]
            )
        )
    ).on_error[0]
    # As the engine builds a failed step's handler from its stored row: a name longer
    # than a plan may write, the timeout already in milliseconds.
    name = "s" * 100 + ".on_error." + "h" * 100

    again = HandlerPlan.from_stored(handler.stored(), name=name)

    assert again == handler.model_copy(update={"name": name})
    assert (again.timeout_ms, again.retry) == (2_000, RetryPolicy())


def test_building_in_code_validates_like_a_submitted_plan() -> None:
    with pytest.raises(ValidationError):
        StepPlan(name="a", tool="noop", nme="b")  # type: ignore[call-arg]
    with pytest.raises(ValidationError):
        StepPlan(name="a")  # type: ignore[call-arg]
    with pytest.raises(ValidationError):
        RetryPolicy(max_attempts=0)


def test_the_typed_plan_cannot_be_changed() -> None:
    plan = valid(one_step())

    with pytest.raises(ValidationError):
        plan.agents[0].tasks[0].steps[0].name = "other"  # type: ignore[misc]


def test_a_handler_is_a_step_without_dependencies_or_handlers() -> None:
    plan = valid(one_step(on_error=[{"name": "h1", "tool": "noop"}]))
    (handler,) = plan.agents[0].tasks[0].steps[0].on_error

    assert isinstance(handler, HandlerPlan)
    assert isinstance(handler, StepPlan)
    assert (handler.depends_on, handler.on_error) == ((), ())


def test_a_retry_policy_round_trips_through_its_stored_form() -> None:
    policy = valid(one_step(retry={"max_attempts": 4, "retry_on": ["timeout"]}))
    stored = policy.agents[0].tasks[0].steps[0].retry.as_dict()

    assert stored["retry_on"] == ["timeout"]
    assert RetryPolicy.from_dict(stored).as_dict() == stored


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(json_values, plan_values))
def test_every_problem_is_worded_for_the_plans_author(data: Any) -> None:
    try:
        parse_plan(data)
    except PlanInvalid as exc:
        for error in exc.errors:
            assert not any(phrase in error.message for phrase in PYDANTIC_PHRASES), error
