"""The built-in tools, called directly with a ToolContext (no worker, no database).

The http tool: test_tool_http.py; the llm tool: test_tool_llm.py. Shared builders:
`tests.orchestrator.tool_support`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from pytest_django.fixtures import Settings

from common.errors import ERROR_CODES
from common.tools import registry
from common.tools.base import ToolError, ToolResult
from orchestrator.tools.asynchronous import callback, poll, validate_callback, validate_poll
from orchestrator.tools.builtin import (
    echo,
    fail,
    http,
    llm,
    noop,
    python,
    runner,
    sleep,
    validate_fail,
    validate_http,
    validate_llm,
    validate_python,
    validate_runner,
    validate_sleep,
    validate_wait,
    wait,
    wait_time,
)
from runs.plan.durations import DURATION_FORMS
from tests.orchestrator.tool_support import StopAfter, Tool, context, failure


# Callables the python tool is allowed to call in some tests (see `allow`).
def returns_a_set() -> set[int]:
    return {1, 2}


def returns_nan() -> float:
    return math.nan


def raises_rate_limited() -> None:
    raise ToolError("rate_limited", "slow down")


@pytest.fixture
def allow(settings: Settings) -> Callable[[str], str]:
    def add(name: str) -> str:
        path = f"{__name__}.{name}"
        settings.PYTHON_TOOL_ALLOWLIST = [*settings.PYTHON_TOOL_ALLOWLIST, path]
        return path

    return add


# --------------------------------------------------------------------------- registry


@pytest.mark.parametrize(
    ("name", "run", "validate"),
    [
        ("noop", noop, None),
        ("echo", echo, None),
        ("sleep", sleep, validate_sleep),
        ("wait", wait, validate_wait),
        ("fail", fail, validate_fail),
        ("http", http, validate_http),
        ("python", python, validate_python),
        ("llm", llm, validate_llm),
        ("approval", None, None),
    ],
)
def test_every_builtin_tool_is_registered_with_its_validator(
    name: str, run: Tool | None, validate: Any
) -> None:
    spec = registry.get(name)
    assert spec is not None
    assert (spec.run, spec.validate) == (run, validate)


# --------------------------------------------------------------------------- wait
NOW = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)
NOT_A_DURATION = f"must be a duration of at least 1ms such as {DURATION_FORMS}, got"
NO_OFFSET = "must be an RFC 3339 time with its offset, got"


@pytest.mark.parametrize(
    "params",
    [
        {"for": "20s"},
        {"for": 1.5},
        {"for": "366d"},
        {"until": "2026-11-29T09:00:00Z"},
        {"until": "2026-11-28T13:00:00+01:00"},  # in the past: it completes at once
        {"until": "${variables.deadline}"},  # checked once rendered
        {"for": "${variables.pause}"},
    ],
    ids=repr,
)
def test_a_wait_takes_one_duration_or_one_time_with_its_offset(params: dict[str, Any]) -> None:
    assert validate_wait(params, now=NOW) == []


@pytest.mark.parametrize(
    ("params", "problem"),
    [
        ({}, ("for", "give one of for (a duration) or until (an RFC 3339 time)")),
        (
            {"for": "1s", "until": "2026-11-29T09:00:00Z"},
            ("for", "give one of for (a duration) or until (an RFC 3339 time)"),
        ),
        ({"for": "367d"}, ("for", "must be at most 366d, got '367d'")),
        ({"for": "soon"}, ("for", f"{NOT_A_DURATION} 'soon'")),
        ({"until": "2026-11-29T09:00:00"}, ("until", f"{NO_OFFSET} '2026-11-29T09:00:00'")),
        ({"until": "tomorrow"}, ("until", f"{NO_OFFSET} 'tomorrow'")),
        (
            {"until": "2027-12-01T00:00Z"},
            ("until", "must be at most 366d ahead, got '2027-12-01T00:00Z'"),
        ),
    ],
    ids=repr,
)
def test_a_wait_out_of_its_forms_or_bounds_is_refused_in_words(
    params: dict[str, Any], problem: tuple[str, str]
) -> None:
    assert validate_wait(params, now=NOW)[-1] == problem


def test_a_rendered_wait_is_read_as_a_time_or_milliseconds() -> None:
    assert wait_time({"for": "1.5s"}, NOW) == (None, 1500)
    until = wait_time({"until": "2026-11-28T13:00:00+01:00"}, NOW)[0]
    assert until == NOW


def test_a_wait_whose_template_rendered_to_no_duration_is_invalid_input() -> None:
    with pytest.raises(ToolError) as caught:
        wait_time({"for": "later"}, NOW)
    assert (caught.value.code, caught.value.retryable) == ("invalid_input", False)
    assert caught.value.message.startswith("for must be a duration")


def test_a_wait_woken_completes_at_no_cost() -> None:
    result = wait({"for": "1s"}, context())
    assert set(result.output) == {"woke_at"}
    assert result.cost is None


# --------------------------------------------------------------------------- noop, echo


def test_noop_outputs_nothing() -> None:
    assert noop({"anything": 1}, context()) == ToolResult(output=None, cost=None)


def test_echo_outputs_its_params() -> None:
    params = {"a": 1, "b": ["x", {"c": None}]}
    assert echo(params, context()) == ToolResult(output=params, cost=None)


# --------------------------------------------------------------------------- sleep


def test_sleep_returns_after_the_time_given() -> None:
    started = time.monotonic()
    result = sleep({"seconds": 0.05}, context())
    assert time.monotonic() - started >= 0.05
    assert result.output == {"slept": 0.05}


def test_sleep_stops_with_cancelled_soon_after_the_step_is_stopped() -> None:
    stop = StopAfter(checks=1)
    started = time.monotonic()
    error = failure(sleep, {"seconds": 60}, context(stop_requested=stop))
    assert (error.code, error.retryable) == ("cancelled", False)
    assert stop.calls == 2
    assert time.monotonic() - started < 5


@pytest.mark.parametrize("seconds", ["soon", -1, None, True, [1]])
def test_sleep_with_seconds_that_are_not_a_duration_is_invalid_input(seconds: Any) -> None:
    error = failure(sleep, {"seconds": seconds})
    assert (error.code, error.retryable) == ("invalid_input", False)


# --------------------------------------------------------------------------- fail


def test_fail_fails_with_a_non_retryable_tool_error_by_default() -> None:
    error = failure(fail, {})
    assert error.as_dict() == {
        "code": "tool_error",
        "message": "failed on purpose",
        "retryable": False,
    }


@pytest.mark.parametrize(
    ("code", "retryable"), [("timeout", True), ("rate_limited", True), ("not_found", False)]
)
def test_fail_fails_with_the_chosen_code_and_message(code: str, retryable: bool) -> None:
    error = failure(fail, {"code": code, "message": "boom"})
    assert (error.code, error.message, error.retryable) == (code, "boom", retryable)


@pytest.mark.parametrize(("code", "retryable"), [("timeout", False), ("not_found", True)])
def test_fail_retryable_overrides_what_the_code_implies(code: str, retryable: bool) -> None:
    error = failure(fail, {"code": code, "retryable": retryable})
    assert (error.code, error.retryable) == (code, retryable)


def test_fail_with_until_attempt_fails_up_to_that_attempt_and_then_succeeds() -> None:
    params = {"code": "transient", "until_attempt": 2}
    assert failure(fail, params, context(attempt=1)).code == "transient"
    assert failure(fail, params, context(attempt=2)).code == "transient"
    assert fail(params, context(attempt=3)).output == {"succeeded_on_attempt": 3}


def test_fail_with_until_attempt_that_is_not_a_number_is_invalid_input() -> None:
    error = failure(fail, {"until_attempt": "twice"})
    assert (error.code, error.retryable) == ("invalid_input", False)


# --------------------------------------------------------------------------- python


def test_python_calls_an_allow_listed_callable_with_its_kwargs() -> None:
    params = {"callable": "orchestrator.tools.examples.add", "kwargs": {"a": 2, "b": 3}}
    assert python(params, context()) == ToolResult(output=5, cost=None)
    params = {"callable": "orchestrator.tools.examples.word_count", "kwargs": {"text": "a b"}}
    assert python(params, context()).output == {"words": 2, "characters": 3}


@pytest.mark.parametrize("path", ["os.system", "orchestrator.tools.examples.missing"])
def test_python_refuses_a_callable_not_in_the_allowlist(path: str) -> None:
    error = failure(python, {"callable": path, "kwargs": {"command": "true"}})
    assert (error.code, error.retryable) == ("permission_denied", False)


@pytest.mark.parametrize(
    "kwargs", [{"a": 1}, {"a": 1, "b": 2, "c": 3}, {"a": 1, "b": "two"}, [1, 2], "a=1"]
)
def test_python_with_kwargs_that_do_not_fit_is_invalid_input(kwargs: Any) -> None:
    error = failure(python, {"callable": "orchestrator.tools.examples.add", "kwargs": kwargs})
    assert (error.code, error.retryable) == ("invalid_input", False)


@pytest.mark.parametrize("params", [{}, {"callable": 42}, {"callable": ""}])
def test_python_without_a_callable_path_is_invalid_input(params: dict[str, Any]) -> None:
    assert failure(python, params).code == "invalid_input"


@pytest.mark.parametrize("name", ["returns_a_set", "returns_nan"])
def test_python_with_a_return_value_that_is_not_json_is_invalid_output(
    allow: Callable[[str], str], name: str
) -> None:
    error = failure(python, {"callable": allow(name)})
    assert (error.code, error.retryable) == ("invalid_output", False)


def test_python_with_an_allow_listed_callable_that_does_not_exist_is_not_found(
    allow: Callable[[str], str],
) -> None:
    error = failure(python, {"callable": allow("no_such_function")})
    assert (error.code, error.retryable) == ("not_found", False)


def test_python_passes_a_tool_error_from_the_callable_through(
    allow: Callable[[str], str],
) -> None:
    error = failure(python, {"callable": allow("raises_rate_limited")})
    assert (error.code, error.message, error.retryable) == ("rate_limited", "slow down", True)


# --------------------------------------------------------------------------- validators


@pytest.mark.parametrize("params", [{"seconds": 0}, {"seconds": 1.5}, {"seconds": "${x.y}"}])
def test_validate_sleep_accepts_a_duration_or_a_template(params: dict[str, Any]) -> None:
    assert validate_sleep(params) == []


def test_validate_sleep_requires_seconds() -> None:
    assert validate_sleep({}) == [("seconds", "is required")]


@pytest.mark.parametrize("seconds", [-1, 86_401, "10", "3s", True, None])
def test_validate_sleep_reports_seconds_out_of_range_or_not_a_number(seconds: Any) -> None:
    assert validate_sleep({"seconds": seconds}) == [("seconds", "must be a number from 0 to 86400")]


@pytest.mark.parametrize(
    "params",
    [
        {},
        {"code": "rate_limited", "message": "x", "retryable": False, "until_attempt": 2},
        {"code": "${variables.code}", "retryable": "${variables.flag}", "until_attempt": "${n}"},
    ],
)
def test_validate_fail_accepts_known_codes_and_templates(params: dict[str, Any]) -> None:
    assert validate_fail(params) == []


def test_validate_fail_reports_every_bad_param() -> None:
    params = {"code": "oops", "retryable": "yes", "until_attempt": -1}
    assert validate_fail(params) == [
        ("until_attempt", "must be a number from 0 to 1000"),
        ("code", f"unknown error code 'oops'; the codes: {', '.join(sorted(ERROR_CODES))}"),
        ("retryable", "must be true or false"),
    ]


def test_an_unknown_code_to_fail_with_is_answered_with_the_valid_ones() -> None:
    ((path, message),) = validate_fail({"code": "timout"})

    assert path == "code"
    assert message.startswith("unknown error code 'timout'; did you mean 'timeout'?")
    for code in ERROR_CODES:
        assert code in message


@pytest.mark.parametrize(
    "params",
    [
        {"url": "https://example.com/"},
        {
            "url": "http://example.com/x",
            "method": "post",
            "headers": {"A": "b"},
            "query": {"q": 1},
            "json": {"a": 1},
            "timeout": 5,
        },
        {"url": "http://example.com/x", "method": "PUT", "body": "text"},
        {
            "url": "${variables.endpoint}",
            "method": "${variables.method}",
            "headers": "${steps.auth.output}",
            "query": "${variables.query}",
            "timeout": "${variables.timeout}",
        },
    ],
)
def test_validate_http_accepts_good_params_and_templates(params: dict[str, Any]) -> None:
    assert validate_http(params) == []


@pytest.mark.parametrize(
    ("params", "problems"),
    [
        ({}, [("url", "is required")]),
        ({"url": ""}, [("url", "must be a non-empty string")]),
        ({"url": "ftp://example.com/"}, [("url", "must be an http:// or https:// URL")]),
        (
            {"url": "http://x/", "method": "BREW"},
            [("method", "must be one of GET, POST, PUT, PATCH, DELETE, HEAD")],
        ),
        (
            {"url": "http://x/", "timeout": 0},
            [("timeout", f"must be a duration of at least 1ms such as {DURATION_FORMS}, got 0")],
        ),
        ({"url": "http://x/", "timeout": "2h"}, [("timeout", "must be at most 1h, got '2h'")]),
        ({"url": "http://x/", "headers": ["A: b"]}, [("headers", "must be an object")]),
        ({"url": "http://x/", "query": "q=1"}, [("query", "must be an object")]),
        (
            {"url": "http://x/", "body": {"a": 1}},
            [("body", "must be a string (use json for data)")],
        ),
        (
            {"url": "http://x/", "json": {}, "body": "b"},
            [("body", "give either json or body, not both")],
        ),
    ],
)
def test_validate_http_reports_bad_params_with_their_path(
    params: dict[str, Any], problems: list[tuple[str, str]]
) -> None:
    assert validate_http(params) == problems


@pytest.mark.parametrize(
    "params",
    [
        {"callable": "orchestrator.tools.examples.add", "kwargs": {"a": 1, "b": 2}},
        {"callable": "orchestrator.tools.examples.word_count"},
        {"callable": "${variables.function}", "kwargs": "${steps.prepare.output}"},
    ],
)
def test_validate_python_accepts_allow_listed_callables_and_templates(
    params: dict[str, Any],
) -> None:
    assert validate_python(params) == []


@pytest.mark.parametrize(
    ("params", "problems"),
    [
        ({}, [("callable", "is required")]),
        ({"callable": 1}, [("callable", "must be a non-empty string")]),
        ({"callable": "os.system"}, [("callable", "'os.system' is not in PYTHON_TOOL_ALLOWLIST")]),
        (
            {"callable": "orchestrator.tools.examples.add", "kwargs": [1, 2]},
            [("kwargs", "must be an object")],
        ),
    ],
)
def test_validate_python_reports_bad_params_with_their_path(
    params: dict[str, Any], problems: list[tuple[str, str]]
) -> None:
    assert validate_python(params) == problems


@pytest.mark.parametrize(
    "params",
    [
        {"prompt": "Summarise ${tasks.gather.steps.search.output.body}"},
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 10, "temperature": 0},
        {"messages": "${steps.history.output}"},
        {"messages": ["${steps.system.output}", {"role": "user", "content": "hi"}]},
        {"prompt": "hi", "max_tokens": "${variables.n}", "timeout": 30},
    ],
)
def test_validate_llm_accepts_a_prompt_or_messages_and_templates(params: dict[str, Any]) -> None:
    assert validate_llm(params) == []


@pytest.mark.parametrize(
    ("params", "problems"),
    [
        ({}, [("prompt", "give a prompt or messages")]),
        ({"prompt": 3}, [("prompt", "must be a string")]),
        (
            {"messages": {"role": "user"}},
            [("messages", "must be a non-empty list of {role, content}")],
        ),
        ({"messages": []}, [("messages", "must be a non-empty list of {role, content}")]),
        (
            {"messages": [{"role": "user", "content": "a"}, "hello"]},
            [("messages[1]", "must be an object with role and content")],
        ),
        ({"prompt": "hi", "temperature": 3}, [("temperature", "must be a number from 0 to 2")]),
    ],
)
def test_validate_llm_reports_bad_params_with_their_path(
    params: dict[str, Any], problems: list[tuple[str, str]]
) -> None:
    assert validate_llm(params) == problems


def test_validate_llm_reports_every_problem_at_once() -> None:
    params = {"messages": "not a list", "max_tokens": 0, "temperature": -1}
    assert validate_llm(params) == [
        ("messages", "must be a non-empty list of {role, content}"),
        ("max_tokens", "must be a number from 1 to 1000000"),
        ("temperature", "must be a number from 0 to 2"),
    ]


# --------------------------------------------------------------------------- durations
# Every tool parameter that is a duration: its validator, parameters it needs besides,
# and its name. Each takes the plan's own forms, refused in the plan's own words.
POLL_PARAMS = {"url": "https://status.example/1", "done_when": "${response.status} == 200"}
DURATION_PARAMS: dict[str, tuple[Callable[[dict[str, Any]], Any], dict[str, Any], str]] = {
    "http.timeout": (validate_http, {"url": "https://example.com/"}, "timeout"),
    "llm.timeout": (validate_llm, {"prompt": "hi"}, "timeout"),
    "runner.match_timeout": (validate_runner, {"prompt": "hi"}, "match_timeout"),
    "callback.timeout": (validate_callback, {}, "timeout"),
    "poll.interval": (validate_poll, POLL_PARAMS, "interval"),
    "poll.timeout": (validate_poll, POLL_PARAMS, "timeout"),
}


@pytest.mark.parametrize("value", ["3s", "2m", " 1.5m ", 5, 2.5, "${variables.wait}"], ids=repr)
@pytest.mark.parametrize("where", list(DURATION_PARAMS))
def test_a_duration_param_takes_the_plans_forms(where: str, value: Any) -> None:
    validate, params, key = DURATION_PARAMS[where]
    assert validate({**params, key: value}) == []


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        ("3 parsecs", "'3 parsecs'"),
        ("30", "'30'"),
        (0, "0"),
        (-5, "-5"),
        (True, "true"),
        (None, "null"),
    ],
    ids=repr,
)
@pytest.mark.parametrize("where", list(DURATION_PARAMS))
def test_a_duration_param_that_is_no_duration_is_refused_in_the_plans_words(
    where: str, value: Any, shown: str
) -> None:
    validate, params, key = DURATION_PARAMS[where]
    message = f"must be a duration of at least 1ms such as {DURATION_FORMS}, got {shown}"
    assert validate({**params, key: value}) == [(key, message)]


@pytest.mark.parametrize(
    ("where", "value", "message"),
    [
        ("runner.match_timeout", "500ms", "must be at least 1s, got '500ms'"),
        ("runner.match_timeout", "2d", "must be at most 1d, got '2d'"),
        ("runner.match_timeout", 86_401, "must be at most 1d, got 86401"),
        ("http.timeout", "61m", "must be at most 1h, got '61m'"),
        ("llm.timeout", 3601, "must be at most 1h, got 3601"),
        ("poll.interval", "10ms", "must be at least 50ms, got '10ms'"),
        ("poll.timeout", "31d", "must be at most 30d, got '31d'"),
        ("callback.timeout", "366d", "must be at most 30d, got '366d'"),
    ],
)
def test_a_duration_param_out_of_its_bounds_is_refused_with_them(
    where: str, value: Any, message: str
) -> None:
    validate, params, key = DURATION_PARAMS[where]
    assert validate({**params, key: value}) == [(key, message)]


def test_the_runner_tool_hands_its_match_timeout_on_in_seconds() -> None:
    assert runner({"prompt": "hi", "match_timeout": "2m"}, context()).wait["match_timeout"] == 120
    assert runner({"prompt": "hi", "match_timeout": 90}, context()).wait["match_timeout"] == 90
    assert runner({"prompt": "hi"}, context()).wait["match_timeout"] is None


def test_the_poll_tool_hands_its_interval_and_timeout_on_in_seconds() -> None:
    wait = poll({**POLL_PARAMS, "interval": "250ms", "timeout": "2m"}, context()).wait
    assert wait is not None
    assert (wait["interval"], wait["timeout"]) == (0.25, 120)


def test_the_callback_tool_opens_its_url_for_its_timeout() -> None:
    opened: list[float] = []

    def open_callback(seconds: float) -> dict[str, str]:
        opened.append(seconds)
        return {"wait": "w", "url": "https://x.invalid/api/v1/callbacks/t"}

    ctx = context()
    ctx.open_callback = open_callback
    callback({"timeout": "1.5h"}, ctx)
    assert opened == [5400]


def test_a_duration_that_renders_to_no_duration_fails_the_step_as_invalid_input() -> None:
    error = failure(http, {"url": "https://example.com/", "timeout": "3 parsecs"})
    assert (error.code, error.retryable) == ("invalid_input", False)
    assert error.message == (
        f"timeout must be a duration of at least 1ms such as {DURATION_FORMS}, got '3 parsecs'"
    )
