"""The llm tool, called directly with a ToolContext (no worker, no database), against a
real local HTTP server speaking the chat completions API (`tests.http_fixture`): what it
sends, what it returns and costs, and its failures."""

from __future__ import annotations

import time
from decimal import Decimal
from typing import TYPE_CHECKING

import pytest
from pytest_django.fixtures import Settings

from billing.pricing import llm_cost
from orchestrator.tools.builtin import llm
from tests.orchestrator.tool_support import closed_port_url, context, failure

if TYPE_CHECKING:
    from tests.http_fixture import HttpServer

CHAT_COMPLETIONS_PATH = "/v1/chat/completions"


@pytest.fixture
def llm_server(http_server: HttpServer, settings: Settings) -> HttpServer:
    settings.LLM_BASE_URL = http_server.llm_base_url + "/"
    settings.LLM_API_KEY = ""
    settings.LLM_MODEL = "default-model"
    settings.BILLING_LLM_PRICE_PER_1K_TOKENS = "0.02"
    return http_server


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
