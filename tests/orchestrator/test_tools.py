"""The built-in tools, called directly with a ToolContext (no worker, no database).

The http and llm tools talk to a real local HTTP server (`tests.http_fixture`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from datetime import UTC, datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import pytest
from pytest_django.fixtures import Settings

from billing.pricing import llm_cost
from common.errors import ERROR_CODES
from common.tools import registry
from common.tools.base import ToolContext, ToolError, ToolResult
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
from tests.support import free_port

if TYPE_CHECKING:
    from tests.http_fixture import HttpServer

# Imported by pytest (not here) so that it is a plugin: the `http_server` fixture.

CHAT_COMPLETIONS_PATH = "/v1/chat/completions"

Tool = Callable[[dict[str, Any], ToolContext], ToolResult]


def context(
    *,
    attempt: int = 1,
    timeout_s: float | None = None,
    stop_requested: Callable[[], bool] = lambda: False,
) -> ToolContext:
    return ToolContext(
        step_id=1,
        run_id="00000000-0000-0000-0000-000000000001",
        attempt=attempt,
        timeout_s=timeout_s,
        stop_requested=stop_requested,
    )


def failure(tool: Tool, params: dict[str, Any], ctx: ToolContext | None = None) -> ToolError:
    with pytest.raises(ToolError) as caught:
        tool(params, ctx or context())
    return caught.value


class StopAfter:
    """A stop_requested that answers False `checks` times, then True; counts its calls."""

    def __init__(self, checks: int) -> None:
        self.checks = checks
        self.calls = 0

    def __call__(self) -> bool:
        self.calls += 1
        return self.calls > self.checks


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


@pytest.fixture
def llm_server(http_server: HttpServer, settings: Settings) -> HttpServer:
    settings.LLM_BASE_URL = http_server.llm_base_url + "/"
    settings.LLM_API_KEY = ""
    settings.LLM_MODEL = "default-model"
    settings.BILLING_LLM_PRICE_PER_1K_TOKENS = "0.02"
    return http_server


def closed_port_url() -> str:
    return f"http://127.0.0.1:{free_port()}"


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


# --------------------------------------------------------------------------- http


def test_http_parses_a_json_body(http_server: HttpServer) -> None:
    http_server.respond("/items", json={"items": [1, 2]}, headers={"X-Trace": "abc"})
    result = http({"url": f"{http_server.url}/items"}, context())
    assert result.output["status"] == 200
    assert result.output["body"] == {"items": [1, 2]}
    assert result.output["headers"]["content-type"] == "application/json"
    assert result.output["headers"]["x-trace"] == "abc"
    assert result.cost is None


@pytest.mark.parametrize("text", ["hello, otters", "42", '{"looks": "like json"}'])
def test_http_keeps_a_text_body_as_text(http_server: HttpServer, text: str) -> None:
    http_server.respond("/page", body=text, headers={"Content-Type": "text/plain"})
    assert http({"url": f"{http_server.url}/page"}, context()).output["body"] == text


def test_http_keeps_a_body_that_says_json_but_is_not_as_text(http_server: HttpServer) -> None:
    http_server.respond("/bad", body="{not json", headers={"Content-Type": "application/json"})
    assert http({"url": f"{http_server.url}/bad"}, context()).output["body"] == "{not json"


def test_http_keeps_nan_as_text_since_the_database_cannot_store_it(
    http_server: HttpServer,
) -> None:
    http_server.respond("/nan", body="NaN", headers={"Content-Type": "application/json"})
    assert http({"url": f"{http_server.url}/nan"}, context()).output["body"] == "NaN"


def test_http_parses_json_of_a_vendor_json_type_with_a_charset(http_server: HttpServer) -> None:
    http_server.respond(
        "/problem",
        body='{"title": "caf\u00e9"}'.encode(),
        headers={"Content-Type": "application/problem+json; charset=utf-8"},
    )
    output = http({"url": f"{http_server.url}/problem"}, context()).output
    assert output["body"] == {"title": "caf\u00e9"}


def test_http_outputs_none_for_an_empty_body(http_server: HttpServer) -> None:
    http_server.respond("/empty", status=204)
    output = http({"url": f"{http_server.url}/empty"}, context()).output
    assert (output["status"], output["body"]) == (204, None)


def test_http_sends_the_method_headers_query_and_json(http_server: HttpServer) -> None:
    http_server.respond("/submit", status=201, json={"id": 7})
    params = {
        "url": f"{http_server.url}/submit",
        "method": "post",
        "headers": {"X-Api-Key": "secret"},
        "query": {"q": "otters", "n": 2},
        "json": {"name": "otter", "tags": ["a"]},
    }
    output = http(params, context()).output
    assert (output["status"], output["body"]) == (201, {"id": 7})
    (request,) = http_server.requests
    assert (request.method, request.path) == ("POST", "/submit")
    assert request.query == {"q": ["otters"], "n": ["2"]}
    assert request.headers["x-api-key"] == "secret"
    assert request.headers["content-type"] == "application/json"
    assert request.json() == {"name": "otter", "tags": ["a"]}


def test_http_sends_a_string_body_as_it_is(http_server: HttpServer) -> None:
    http_server.respond("/notify", status=204)
    params = {"url": f"{http_server.url}/notify", "method": "PUT", "body": "timeout: too slow"}
    http(params, context())
    (request,) = http_server.requests
    assert (request.method, request.body) == ("PUT", b"timeout: too slow")


@pytest.mark.parametrize(
    ("status", "code", "retryable"),
    [
        (429, "rate_limited", True),
        (502, "bad_gateway", True),
        (503, "service_unavailable", True),
        (504, "gateway_timeout", True),
        (408, "timeout", True),
        (500, "server_error", True),
        (501, "server_error", True),
        (400, "invalid_input", False),
        (422, "invalid_input", False),
        (401, "auth_error", False),
        (403, "permission_denied", False),
        (404, "not_found", False),
    ],
)
def test_http_error_statuses_raise_their_code(
    http_server: HttpServer, status: int, code: str, retryable: bool
) -> None:
    http_server.respond("/api", status=status)
    error = failure(http, {"url": f"{http_server.url}/api"})
    assert (error.code, error.retryable, error.message) == (code, retryable, f"HTTP {status}")


def test_http_error_message_quotes_the_start_of_the_response_body(
    http_server: HttpServer,
) -> None:
    http_server.respond("/api", status=400, body="field 'q' is required" + "!" * 1000)
    error = failure(http, {"url": f"{http_server.url}/api"})
    assert error.message.startswith("HTTP 400: field 'q' is required!")
    assert len(error.message) < 400


def test_http_retried_after_rate_limits_succeeds_once_the_server_answers(
    http_server: HttpServer,
) -> None:
    http_server.respond("/flaky", status=429, times=2)
    http_server.respond("/flaky", json={"ok": True})
    params = {"url": f"{http_server.url}/flaky"}
    assert failure(http, params).code == "rate_limited"
    assert failure(http, params).code == "rate_limited"
    assert http(params, context()).output["body"] == {"ok": True}
    assert http(params, context()).output["body"] == {"ok": True}
    assert len(http_server.requests) == 4


def test_http_times_out_when_the_server_is_slower_than_the_timeout(
    http_server: HttpServer,
) -> None:
    http_server.respond("/slow", json={}, delay=10)
    started = time.monotonic()
    error = failure(http, {"url": f"{http_server.url}/slow", "timeout": 0.2})
    assert (error.code, error.retryable) == ("timeout", True)
    assert time.monotonic() - started < 5


def test_http_without_a_timeout_uses_the_step_timeout(http_server: HttpServer) -> None:
    http_server.respond("/slow", json={}, delay=10)
    error = failure(http, {"url": f"{http_server.url}/slow"}, context(timeout_s=0.2))
    assert (error.code, error.retryable) == ("timeout", True)


def test_http_times_out_when_a_trickling_download_outlasts_the_timeout(
    http_server: HttpServer,
) -> None:
    # Each chunk arrives well within the timeout; the whole body does not.
    http_server.respond("/trickle", chunks=[b"x"] * 50, chunk_delay=0.05)
    started = time.monotonic()
    error = failure(http, {"url": f"{http_server.url}/trickle", "timeout": 0.3})
    assert (error.code, error.retryable) == ("timeout", True)
    assert time.monotonic() - started < 2


def test_http_stops_with_cancelled_while_downloading(http_server: HttpServer) -> None:
    http_server.respond("/trickle", chunks=[b"x"] * 100, chunk_delay=0.05)
    stop = StopAfter(checks=0)
    started = time.monotonic()
    error = failure(http, {"url": f"{http_server.url}/trickle"}, context(stop_requested=stop))
    assert (error.code, error.retryable) == ("cancelled", False)
    assert stop.calls == 1
    assert time.monotonic() - started < 3


def test_http_reads_a_streamed_body_to_the_end(http_server: HttpServer) -> None:
    http_server.respond("/stream", chunks=[b"one ", b"two ", b"three"])
    assert http({"url": f"{http_server.url}/stream"}, context()).output["body"] == "one two three"


def test_http_to_a_closed_port_is_a_retryable_connection_error(settings: Settings) -> None:
    settings.HTTP_TOOL_ALLOWED_NETWORKS = ["127.0.0.1/32"]  # past the guard, to the port
    error = failure(http, {"url": f"{closed_port_url()}/"})
    assert (error.code, error.retryable) == ("connection_error", True)


def test_http_response_up_to_the_size_limit_is_kept(
    http_server: HttpServer, settings: Settings
) -> None:
    settings.HTTP_TOOL_MAX_RESPONSE_BYTES = 100
    http_server.respond("/big", body=b"x" * 100)
    assert http({"url": f"{http_server.url}/big"}, context()).output["body"] == "x" * 100


@pytest.mark.parametrize("streamed", [False, True])
def test_http_response_over_the_size_limit_is_invalid_output(
    http_server: HttpServer, settings: Settings, streamed: bool
) -> None:
    settings.HTTP_TOOL_MAX_RESPONSE_BYTES = 100
    if streamed:
        http_server.respond("/big", chunks=[b"x" * 60] * 2)
    else:
        http_server.respond("/big", body=b"x" * 101)
    error = failure(http, {"url": f"{http_server.url}/big"})
    assert (error.code, error.retryable) == ("invalid_output", False)
    assert "100 bytes" in error.message


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_http_does_not_follow_a_redirect_but_returns_it(
    http_server: HttpServer, status: int
) -> None:
    http_server.respond("/old", status=status, headers={"Location": "/new"})
    http_server.respond("/new", json={"followed": True})
    output = http({"url": f"{http_server.url}/old"}, context()).output
    assert output["status"] == status
    assert output["headers"]["location"] == "/new"
    assert output["body"] is None
    assert [request.path for request in http_server.requests] == ["/old"]


def test_http_head_request_returns_the_headers(http_server: HttpServer) -> None:
    http_server.respond("/doc", body=b"not sent", headers={"ETag": '"v1"'})
    output = http({"url": f"{http_server.url}/doc", "method": "HEAD"}, context()).output
    assert (output["status"], output["headers"]["etag"], output["body"]) == (200, '"v1"', None)


@pytest.mark.parametrize(
    "params",
    [
        {},
        {"url": "ftp://example.com/file"},
        {"url": "example.com"},
        {"url": 42},
        {"url": "http://"},
        {"url": "http://127.0.0.1/", "method": "BREW"},
        {"url": "http://127.0.0.1/", "headers": ["X-A: 1"]},
        {"url": "http://127.0.0.1/", "headers": {"X-A": 1}},
        {"url": "http://127.0.0.1/", "headers": {"X-A": "caf\u00e9"}},
        {"url": "http://127.0.0.1/", "query": "q=1"},
        {"url": "http://127.0.0.1/", "body": {"a": 1}},
        {"url": "http://127.0.0.1/", "timeout": "soon"},
    ],
)
def test_http_with_unusable_params_is_invalid_input_and_not_retried(
    params: dict[str, Any],
) -> None:
    error = failure(http, params)
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


# --------------------------------------------------------------------------- llm


def test_llm_returns_the_content_usage_and_model(llm_server: HttpServer) -> None:
    llm_server.chat_completion(content="Otters hold hands.", total_tokens=42)
    output = llm({"prompt": "Tell me about otters"}, context()).output
    assert output == {
        "content": "Otters hold hands.",
        "usage": {"prompt_tokens": 21, "completion_tokens": 21, "total_tokens": 42},
        "model": "test-model",
    }


def test_llm_costs_the_token_price_of_its_total_tokens(
    llm_server: HttpServer, settings: Settings
) -> None:
    settings.BILLING_LLM_PRICE_PER_1K_TOKENS = "0.5"
    llm_server.chat_completion(total_tokens=1234)
    cost = llm({"prompt": "hi"}, context()).cost
    assert isinstance(cost, Decimal)
    assert cost == llm_cost(1234) == Decimal("0.617")


def test_llm_without_usage_costs_nothing(llm_server: HttpServer) -> None:
    answer = {"model": "m", "choices": [{"message": {"role": "assistant", "content": "ok"}}]}
    llm_server.respond(CHAT_COMPLETIONS_PATH, json=answer)
    result = llm({"prompt": "hi"}, context())
    assert (result.output["usage"], result.cost) == ({}, Decimal(0))


def test_llm_sends_the_api_key_as_a_bearer_token(
    llm_server: HttpServer, settings: Settings
) -> None:
    settings.LLM_API_KEY = "sk-test"
    llm_server.chat_completion()
    llm({"prompt": "hi"}, context())
    (request,) = llm_server.requests
    assert request.headers["authorization"] == "Bearer sk-test"


def test_llm_sends_no_authorization_without_an_api_key(llm_server: HttpServer) -> None:
    llm_server.chat_completion()
    llm({"prompt": "hi"}, context())
    (request,) = llm_server.requests
    assert "authorization" not in request.headers


def test_llm_sends_the_prompt_as_a_user_message_to_the_default_model(
    llm_server: HttpServer,
) -> None:
    llm_server.chat_completion()
    llm({"prompt": "Summarise otters"}, context())
    (request,) = llm_server.requests
    assert (request.method, request.path) == ("POST", CHAT_COMPLETIONS_PATH)
    assert request.json() == {
        "model": "default-model",
        "messages": [{"role": "user", "content": "Summarise otters"}],
    }


def test_llm_passes_messages_model_and_sampling_params_through(llm_server: HttpServer) -> None:
    llm_server.chat_completion()
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Otters?"},
    ]
    params = {"messages": messages, "model": "big", "max_tokens": 50, "temperature": 0.2}
    llm(params, context())
    (request,) = llm_server.requests
    assert request.json() == {
        "model": "big",
        "messages": messages,
        "max_tokens": 50,
        "temperature": 0.2,
    }


@pytest.mark.parametrize(
    ("status", "code", "retryable"),
    [
        (429, "llm_rate_limited", True),
        (500, "llm_service_error", True),
        (503, "llm_service_error", True),
        (408, "llm_timeout", True),
        (401, "auth_error", False),
        (403, "auth_error", False),
        (400, "invalid_input", False),
    ],
)
def test_llm_error_statuses_raise_their_code(
    llm_server: HttpServer, status: int, code: str, retryable: bool
) -> None:
    llm_server.chat_completion(status=status)
    error = failure(llm, {"prompt": "hi"})
    assert (error.code, error.retryable) == (code, retryable)


def test_llm_retried_after_a_rate_limit_succeeds(llm_server: HttpServer) -> None:
    llm_server.chat_completion(status=429, times=1)
    llm_server.chat_completion(content="finally")
    assert failure(llm, {"prompt": "hi"}).code == "llm_rate_limited"
    assert llm({"prompt": "hi"}, context()).output["content"] == "finally"


@pytest.mark.parametrize(
    "body",
    [
        b"<html>not json</html>",
        b"NaN",
        b"[]",
        b'{"choices": []}',
        b'{"choices": [{"text": "legacy completion"}]}',
        b'{"choices": [{"message": {"content": "x"}}], "usage": {"total_tokens": "many"}}',
        b'{"choices": [{"message": {"content": "x"}}], "usage": {"total_tokens": -5}}',
        b'{"choices": [{"message": {"content": "x"}}], "usage": [1]}',
    ],
)
def test_llm_with_a_malformed_response_is_invalid_output(
    llm_server: HttpServer, body: bytes
) -> None:
    llm_server.respond(CHAT_COMPLETIONS_PATH, body=body, headers={"Content-Type": "text/html"})
    error = failure(llm, {"prompt": "hi"})
    assert (error.code, error.retryable) == ("invalid_output", False)


def test_llm_without_a_base_url_is_a_non_retryable_tool_error(
    settings: Settings,
) -> None:
    settings.LLM_BASE_URL = ""
    error = failure(llm, {"prompt": "hi"})
    assert (error.code, error.retryable) == ("tool_error", False)


def test_llm_with_a_base_url_that_is_not_http_is_a_non_retryable_tool_error(
    settings: Settings,
) -> None:
    settings.LLM_BASE_URL = "llm.internal/v1"
    error = failure(llm, {"prompt": "hi"})
    assert (error.code, error.retryable) == ("tool_error", False)


def test_llm_slower_than_its_timeout_is_a_retryable_llm_timeout(llm_server: HttpServer) -> None:
    llm_server.chat_completion(delay=10)
    started = time.monotonic()
    error = failure(llm, {"prompt": "hi", "timeout": 0.2})
    assert (error.code, error.retryable) == ("llm_timeout", True)
    assert time.monotonic() - started < 5


def test_llm_unreachable_is_a_retryable_connection_error(settings: Settings) -> None:
    settings.LLM_BASE_URL = f"{closed_port_url()}/v1"
    error = failure(llm, {"prompt": "hi"})
    assert (error.code, error.retryable) == ("connection_error", True)


def test_llm_with_messages_that_are_not_a_list_is_invalid_input(llm_server: HttpServer) -> None:
    error = failure(llm, {"messages": {"role": "user", "content": "hi"}})
    assert (error.code, error.retryable) == ("invalid_input", False)
    assert llm_server.requests == []


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


def test_http_takes_its_timeout_as_a_duration(http_server: HttpServer) -> None:
    http_server.respond("/slow", json={}, delay=10)
    started = time.monotonic()
    error = failure(http, {"url": f"{http_server.url}/slow", "timeout": "200ms"})
    assert (error.code, error.retryable) == ("timeout", True)
    assert time.monotonic() - started < 5
