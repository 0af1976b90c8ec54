"""The one reading of a duration (runs/plan/durations.py): the forms it takes, its bounds,
and the words of a refusal, which the plan's fields and the tools' parameters share."""

from __future__ import annotations

from typing import Any

import pytest

from runs.plan import DurationRefused, PlanInvalid, parse_plan, read_duration_ms, seconds_ms
from runs.plan.durations import DURATION_FORMS, MAX_DURATION_MS

NOT_A_DURATION = f"must be a duration of at least 1ms such as {DURATION_FORMS}, got "


def refusal(value: Any, **bounds: int) -> str:
    with pytest.raises(DurationRefused) as refused:
        read_duration_ms(value, **bounds)
    return str(refused.value)


@pytest.mark.parametrize(
    ("value", "ms"),
    [
        ("250ms", 250),
        ("3s", 3_000),
        ("1.5s", 1_500),
        ("5m", 300_000),
        ("2h", 7_200_000),
        ("1.5h", 5_400_000),
        ("7d", 604_800_000),
        (" 30 s ", 30_000),
        (30, 30_000),
        (1.5, 1_500),
        (0.001, 1),
    ],
    ids=repr,
)
def test_a_duration_is_read_in_milliseconds(value: Any, ms: int) -> None:
    assert read_duration_ms(value) == ms


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        # A string needs its unit, as the plan's fields have always asked: "30" is refused.
        ("30", "'30'"),
        ("3 parsecs", "'3 parsecs'"),
        ("5 mins", "'5 mins'"),
        ("-5s", "'-5s'"),
        ("0s", "'0s'"),
        ("", "''"),
        (0, "0"),
        (-1, "-1"),
        (0.0001, "0.0001"),
        (True, "true"),
        (None, "null"),
        ([], "[]"),
        ({"s": 1}, '{"s":1}'),
    ],
    ids=repr,
)
def test_what_is_no_duration_is_refused_showing_the_value(value: Any, shown: str) -> None:
    assert refusal(value) == NOT_A_DURATION + shown


def test_a_duration_below_its_minimum_is_refused_with_the_minimum() -> None:
    assert refusal("500ms", minimum_ms=1_000) == "must be at least 1s, got '500ms'"
    assert read_duration_ms("1s", minimum_ms=1_000) == 1_000


def test_a_duration_above_its_maximum_is_refused_with_the_maximum() -> None:
    assert refusal("2d", maximum_ms=86_400_000) == "must be at most 1d, got '2d'"
    assert refusal(86_401, maximum_ms=86_400_000) == "must be at most 1d, got 86401"
    assert read_duration_ms("24h", maximum_ms=86_400_000) == 86_400_000


def test_no_duration_is_longer_than_a_year_whatever_its_maximum_says() -> None:
    assert refusal("366d", maximum_ms=10 * MAX_DURATION_MS) == "must be at most 365d, got '366d'"
    assert refusal(1e300) == "must be at most 365d, got 1e+300"


@pytest.mark.parametrize(("seconds", "ms"), [(0.05, 50), (1, 1_000), (30 * 86_400, 2_592_000_000)])
def test_a_bound_in_seconds_is_compared_in_whole_milliseconds(seconds: float, ms: int) -> None:
    assert seconds_ms(seconds) == ms


def test_a_plan_field_and_a_tool_parameter_refuse_in_the_same_words() -> None:
    runner_step = {
        "name": "s",
        "tool": "runner",
        "params": {"prompt": "p", "match_timeout": "3 parsecs"},
    }
    plan = {
        "name": "p",
        "timeouts": {"run": "3 parsecs"},
        "agents": [{"name": "a", "tasks": [{"name": "t", "steps": [runner_step]}]}],
    }
    with pytest.raises(PlanInvalid) as refused:
        parse_plan(plan)
    assert {(error.path, error.message) for error in refused.value.errors} == {
        ("timeouts.run", NOT_A_DURATION + "'3 parsecs'"),
        ("agents[0].tasks[0].steps[0].params.match_timeout", NOT_A_DURATION + "'3 parsecs'"),
    }
