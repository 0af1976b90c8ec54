"""The http tool, called directly with a ToolContext (no worker, no database), against a
real local HTTP server (`tests.http_fixture`): bodies, statuses, redirects, time and size
limits, and stops."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import pytest
from pytest_django.fixtures import Settings

from orchestrator.tools.builtin import http
from tests.orchestrator.tool_support import StopAfter, closed_port_url, context, failure

if TYPE_CHECKING:
    from tests.http_fixture import HttpServer


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


def test_http_takes_its_timeout_as_a_duration(http_server: HttpServer) -> None:
    http_server.respond("/slow", json={}, delay=10)
    started = time.monotonic()
    error = failure(http, {"url": f"{http_server.url}/slow", "timeout": "200ms"})
    assert (error.code, error.retryable) == ("timeout", True)
    assert time.monotonic() - started < 5
