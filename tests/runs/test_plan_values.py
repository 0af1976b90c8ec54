"""A plan's values (runs/plan/): durations, enums and integers in range, the retry policy
and its defaults, credits as decimals, variables as a bounded object."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from runs.plan import PlanInvalid, RetryPolicy, parse_duration_ms, parse_plan
from tests.runs.plans import (
    HANDLER,
    STEP,
    agent,
    assert_only_error,
    errors_of,
    limits,
    one_step,
    plan,
    task,
    the_step,
    valid,
    with_handler,
)

BAD_DURATIONS: list[Any] = ["30x", "-5s", "0s", "0.5ms", "", "30", "5 mins", "1e3s", "9" * 20 + "s"]
BAD_DURATIONS += [True, False, None, [], {}, -1, 0, 0.0001]
DURATION_PLACES = {
    "timeouts.run": lambda value: plan(timeouts={"run": value}),
    "timeouts.step": lambda value: plan(timeouts={"step": value}),
    "agents[0].timeout": lambda value: plan(agent("a1", timeout=value)),
    "agents[0].tasks[0].timeout": lambda value: plan(agent("a1", task("t1", timeout=value))),
    f"{STEP}.timeout": lambda value: one_step(timeout=value),
    f"{HANDLER}.timeout": lambda value: with_handler(timeout=value),
}


@pytest.mark.parametrize("value", BAD_DURATIONS, ids=repr)
@pytest.mark.parametrize("path", list(DURATION_PLACES))
def test_a_malformed_duration_is_refused(path: str, value: Any) -> None:
    assert_only_error(
        DURATION_PLACES[path](value), path, "must be a duration of at least 1ms such as '250ms'"
    )


@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan")], ids=repr)
@pytest.mark.parametrize("path", list(DURATION_PLACES))
def test_a_duration_that_is_not_a_json_number_is_refused_as_such(path: str, value: Any) -> None:
    assert_only_error(DURATION_PLACES[path](value), path, "NaN and Infinity are not JSON numbers")


@pytest.mark.parametrize(
    ("value", "ms"),
    [
        ("250ms", 250),
        ("30s", 30_000),
        ("5m", 300_000),
        ("1.5h", 5_400_000),
        ("7d", 604_800_000),
        (" 2 s ", 2000),
        ("1.0005s", 1000),
        (30, 30_000),
        (0.25, 250),
        (1.5, 1500),
    ],
)
def test_a_duration_is_converted_to_milliseconds(value: Any, ms: int) -> None:
    assert parse_duration_ms(value) == ms
    assert valid(plan(timeouts={"run": value})).timeouts_ms == {"run": ms}


@pytest.mark.parametrize(
    "value", [float("inf"), float("nan"), "9" * 400 + "s", 1e-9, {"s": 1}, "30s\nx", "٣s"]
)
def test_parse_duration_ms_refuses_oddities_without_raising(value: Any) -> None:
    assert parse_duration_ms(value) is None


def test_a_step_timeout_over_the_maximum_is_refused() -> None:
    small = limits(max_step_timeout_ms=60_000)
    assert_only_error(one_step(timeout="2m"), f"{STEP}.timeout", "must be at most 1m", small)
    assert_only_error(plan(timeouts={"step": 61}), "timeouts.step", "must be at most 1m", small)
    assert the_step(valid(one_step(timeout="1m"), small)).timeout_ms == 60_000


def test_a_duration_longer_than_a_year_is_refused() -> None:
    assert_only_error(plan(timeouts={"run": "366d"}), "timeouts.run", "must be at most 365d")
    assert_only_error(plan(timeouts={"run": 1e300}), "timeouts.run", "must be at most 365d")


# --------------------------------------------------------------------------- enums, integers
@pytest.mark.parametrize(
    ("data", "path", "fragment"),
    [
        (
            plan(mode="dga"),
            "mode",
            "must be one of sequential, parallel, dag, got 'dga'; did you mean 'dag'?",
        ),
        (plan(agent("a1", mode="serial")), "agents[0].mode", "got 'serial'"),
        (plan(agent("a1", task("t1", mode=1))), "agents[0].tasks[0].mode", "got 1"),
        (plan(failure_mode="fail_fast"), "failure_mode", "did you mean 'fail-fast'?"),
        (plan(agent("a1", failure_mode="ignore")), "agents[0].failure_mode", "got 'ignore'"),
        (
            plan(agent("a1", task("t1", failure_mode=None))),
            "agents[0].tasks[0].failure_mode",
            "must be one of fail-fast, continue, retry, got null",
        ),
        (
            one_step(retry={"backoff": "expo"}),
            f"{STEP}.retry.backoff",
            "must be one of fixed, linear, exponential, got 'expo'",
        ),
    ],
)
def test_a_bad_enum_value_is_refused(data: dict[str, Any], path: str, fragment: str) -> None:
    assert_only_error(data, path, fragment)


@pytest.mark.parametrize(
    ("data", "path", "fragment"),
    [
        (plan(priority=10), "priority", "must be an integer from 0 to 9, got 10"),
        (plan(priority=-1), "priority", "got -1"),
        (plan(priority="5"), "priority", "got '5'"),
        (plan(priority=5.0), "priority", "got 5.0"),
        (plan(priority=True), "priority", "got true"),
        (plan(max_attempts=0), "max_attempts", "must be an integer from 1 to 10, got 0"),
        (plan(max_agents=0), "max_agents", "must be an integer from 1 to 100, got 0"),
        (
            plan(agent("a1", max_concurrent_tasks=10_001)),
            "agents[0].max_concurrent_tasks",
            "must be an integer from 1 to 10000, got 10001",
        ),
        (
            plan(agent("a1", task("t1", max_concurrent_steps=0))),
            "agents[0].tasks[0].max_concurrent_steps",
            "must be an integer from 1 to 10000, got 0",
        ),
        (
            plan(agent("a1", task("t1", max_concurrent_steps=False))),
            "agents[0].tasks[0].max_concurrent_steps",
            "got false",
        ),
        (
            one_step(retry={"max_attempts": 0}),
            f"{STEP}.retry.max_attempts",
            "must be an integer from 1 to 20, got 0",
        ),
        (one_step(retry={"max_failures": 21}), f"{STEP}.retry.max_failures", "got 21"),
        (one_step(retry={"base_delay_ms": -1}), f"{STEP}.retry.base_delay_ms", "got -1"),
    ],
)
def test_an_integer_out_of_range_or_of_the_wrong_type_is_refused(
    data: dict[str, Any], path: str, fragment: str
) -> None:
    assert_only_error(data, path, fragment)


def test_the_default_max_agents_respects_a_lower_limit() -> None:
    assert valid(plan(), limits(max_agents=3)).max_agents == 3


# --------------------------------------------------------------------------- retry policy
@pytest.mark.parametrize(
    ("retry", "path", "fragment"),
    [
        (
            {"base_delay_ms": 5000, "max_delay_ms": 1000},
            "max_delay_ms",
            "must be at least base_delay_ms (5000), got 1000",
        ),
        (
            {"retry_on": ["timout"]},
            "retry_on[0]",
            "unknown error code 'timout'; did you mean 'timeout'?",
        ),
        ({"retry_on": [5]}, "retry_on[0]", "unknown error code 5"),
        ({"retry_on": [["timeout"]]}, "retry_on[0]", 'unknown error code ["timeout"]'),
        ({"retry_on": ["auth_error"]}, "retry_on[0]", "'auth_error' is never retried"),
        ({"retry_on": "timeout"}, "retry_on", "must be a list of error codes, got a string"),
        ({"jitter": 1.5}, "jitter", "must be a number from 0.0 to 1.0, got 1.5"),
        ({"jitter": -0.1}, "jitter", "got -0.1"),
        ({"jitter": True}, "jitter", "got true"),
        ({"multiplier": 0.5}, "multiplier", "must be a number from 1.0 to 10.0, got 0.5"),
        ({"multiplier": float("nan")}, "multiplier", "NaN and Infinity are not JSON numbers"),
    ],
)
def test_a_retry_policy_problem_is_refused(retry: dict[str, Any], path: str, fragment: str) -> None:
    assert_only_error(one_step(retry=retry), f"{STEP}.retry.{path}", fragment)


def test_a_retry_policy_is_normalised_with_defaults() -> None:
    policy = the_step(
        valid(one_step(retry={"max_attempts": 5, "retry_on": ["timeout", "timeout"]}))
    ).retry
    assert policy == RetryPolicy(max_attempts=5, max_failures=5, retry_on=("timeout",))
    assert the_step(valid(one_step())).retry == RetryPolicy()
    assert the_step(valid(one_step(retry={"base_delay_ms": 60_000}))).retry.max_delay_ms == 60_000


# --------------------------------------------------------------------------- credits
@pytest.mark.parametrize(
    "credits",
    [
        -1,
        0,
        0.0,
        "0",
        "abc",
        "",
        "-5",
        "1e3",
        "NaN",
        True,
        None,
        [],
        {},
        1.1234567,
        "1.1234567",
        10**12,
    ],
    ids=repr,
)
def test_bad_credits_are_refused(credits: Any) -> None:
    assert_only_error(
        plan(credits=credits),
        "credits",
        "must be a positive number below 1000000000000 with at most 6 decimals",
    )


@pytest.mark.parametrize(
    ("credits", "expected"),
    [
        (500, Decimal("500")),
        ("12.5", Decimal("12.5")),
        (0.25, Decimal("0.25")),
        (0.000001, Decimal("0.000001")),
        ("999999999999.999999", Decimal("999999999999.999999")),
    ],
)
def test_valid_credits_become_a_decimal(credits: Any, expected: Decimal) -> None:
    result = valid(plan(credits=credits))
    assert isinstance(result.credits, Decimal)
    assert result.credits == expected


def test_a_number_too_long_for_json_is_refused_not_crashed_on() -> None:
    huge = 10**5000  # Python's json refuses ints of more than 4,300 digits
    assert errors_of(plan(credits=huge)) == [("", "plan cannot be written as JSON")]
    with pytest.raises(PlanInvalid) as caught:  # the API passes the body's size instead
        parse_plan(plan(credits=huge), size_hint=100)
    assert [error.path for error in caught.value.errors] == ["credits"]


def test_credits_are_none_when_omitted() -> None:
    assert valid(plan()).credits is None


# --------------------------------------------------------------------------- variables
@pytest.mark.parametrize(
    ("variables", "got"), [([], "a list"), ("topic", "a string"), (None, "null")]
)
def test_variables_must_be_an_object(variables: Any, got: str) -> None:
    assert_only_error(plan(variables=variables), "variables", f"must be an object, got {got}")


def test_variables_over_the_size_limit_are_refused() -> None:
    small = limits(max_variables_bytes=50)
    assert_only_error(
        plan(variables={"topic": "x" * 50}),
        "variables",
        "must be at most 50 bytes as JSON, got 62",
        small,
    )
    assert valid(plan(variables={"topic": "x" * 30}), small).variables == {"topic": "x" * 30}
