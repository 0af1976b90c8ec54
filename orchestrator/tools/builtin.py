"""The built-in tools: noop, echo, sleep, fail, http, python, llm (and approval, which no
worker executes). Each validates its parameters for the plan validator, where it can
(a value that is still a `${...}` template is checked only when rendered).
"""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import httpx
from django.conf import settings
from django.utils.module_loading import import_string

from billing.pricing import llm_cost
from orchestrator.errors import ERROR_CODES
from orchestrator.tools.base import ToolContext, ToolError, ToolResult, has_template
from orchestrator.tools.registry import register

Problems = list[tuple[str, str]]


def _number(params: dict[str, Any], key: str, low: float, high: float, required: bool) -> Problems:
    if key not in params:
        return [(key, "is required")] if required else []
    value = params[key]
    if has_template(value):
        return []
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        return [(key, f"must be a number from {low} to {high}")]
    return []


def _string(params: dict[str, Any], key: str, required: bool = True) -> Problems:
    if key not in params:
        return [(key, "is required")] if required else []
    if not isinstance(params[key], str) or not params[key]:
        return [(key, "must be a non-empty string")]
    return []


# --------------------------------------------------------------------------- noop, echo
def noop(params: dict[str, Any], ctx: ToolContext) -> ToolResult:
    return ToolResult(output=None)


def echo(params: dict[str, Any], ctx: ToolContext) -> ToolResult:
    """Return the (rendered) params: handy to pass values along and in tests."""
    return ToolResult(output=params)


# --------------------------------------------------------------------------- sleep
def sleep(params: dict[str, Any], ctx: ToolContext) -> ToolResult:
    seconds = float(params.get("seconds", 1))
    ctx.sleep(seconds)
    return ToolResult(output={"slept": seconds})


def validate_sleep(params: dict[str, Any]) -> Problems:
    return _number(params, "seconds", 0, 86_400, required=True)


# --------------------------------------------------------------------------- fail
def fail(params: dict[str, Any], ctx: ToolContext) -> ToolResult:
    """Fail with a chosen code; with `until_attempt: N`, only attempts 1..N fail."""
    until = params.get("until_attempt")
    if until is not None and ctx.attempt > int(until):
        return ToolResult(output={"succeeded_on_attempt": ctx.attempt})
    retryable = params.get("retryable")
    raise ToolError(
        str(params.get("code", "tool_error")),
        str(params.get("message", "failed on purpose")),
        None if retryable is None else bool(retryable),
    )


def validate_fail(params: dict[str, Any]) -> Problems:
    problems = _number(params, "until_attempt", 0, 1000, required=False)
    code = params.get("code", "tool_error")
    if not has_template(code) and (not isinstance(code, str) or code not in ERROR_CODES):
        problems.append(("code", f"unknown error code {code!r}"))
    if "retryable" in params and not isinstance(params["retryable"], bool):
        problems.append(("retryable", "must be true or false"))
    return problems


# --------------------------------------------------------------------------- http
HTTP_RETRYABLE = {
    429: "rate_limited",
    502: "bad_gateway",
    503: "service_unavailable",
    504: "gateway_timeout",
}
HTTP_NON_RETRYABLE = {401: "auth_error", 403: "permission_denied", 404: "not_found"}
HTTP_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE", "HEAD")


def http(params: dict[str, Any], ctx: ToolContext) -> ToolResult:
    timeout = float(params.get("timeout", ctx.timeout_s or 30))
    limit = settings.HTTP_TOOL_MAX_RESPONSE_BYTES
    try:
        with (
            httpx.Client(timeout=timeout, follow_redirects=False) as client,
            client.stream(
                str(params.get("method", "GET")).upper(),
                str(params["url"]),
                headers=params.get("headers") or {},
                params=params.get("query") or None,
                json=params.get("json"),
                content=params.get("body"),
            ) as response,
        ):
            body = b""
            for chunk in response.iter_bytes():
                body += chunk
                if len(body) > limit:
                    raise ToolError("invalid_output", f"response larger than {limit} bytes")
                if ctx.stop_requested():
                    raise ToolError("cancelled", "the step was cancelled while running", False)
    except httpx.TimeoutException as exc:
        raise ToolError("timeout", f"HTTP request timed out: {exc}") from exc
    except httpx.TransportError as exc:
        raise ToolError("connection_error", f"HTTP request failed: {exc}") from exc
    status = response.status_code
    if status in HTTP_RETRYABLE:
        raise ToolError(HTTP_RETRYABLE[status], f"HTTP {status}")
    if status >= 500:
        raise ToolError("server_error", f"HTTP {status}")
    if status >= 400:
        raise ToolError(HTTP_NON_RETRYABLE.get(status, "invalid_input"), f"HTTP {status}", False)
    text = body.decode(response.encoding or "utf-8", errors="replace")
    try:
        parsed: Any = json.loads(text) if text else None
    except ValueError:
        parsed = text
    return ToolResult(output={"status": status, "headers": dict(response.headers), "body": parsed})


def validate_http(params: dict[str, Any]) -> Problems:
    problems = _string(params, "url")
    url = params.get("url")
    if (
        isinstance(url, str)
        and not has_template(url)
        and not url.startswith(("http://", "https://"))
    ):
        problems.append(("url", "must be an http:// or https:// URL"))
    method = params.get("method", "GET")
    if not has_template(method) and str(method).upper() not in HTTP_METHODS:
        problems.append(("method", f"must be one of {', '.join(HTTP_METHODS)}"))
    problems += _number(params, "timeout", 0.001, 3600, required=False)
    if "json" in params and "body" in params:
        problems.append(("body", "give either json or body, not both"))
    return problems


# --------------------------------------------------------------------------- python
def python(params: dict[str, Any], ctx: ToolContext) -> ToolResult:
    """Call an allow-listed callable with `kwargs`; its return value is the output."""
    path = str(params["callable"])
    if path not in settings.PYTHON_TOOL_ALLOWLIST:
        raise ToolError("permission_denied", f"{path} is not in PYTHON_TOOL_ALLOWLIST", False)
    try:
        function = import_string(path)
    except ImportError as exc:
        raise ToolError("not_found", f"cannot import {path}: {exc}", False) from exc
    try:
        output = function(**(params.get("kwargs") or {}))
    except ToolError:
        raise
    except (TypeError, ValueError) as exc:
        raise ToolError("invalid_input", f"{path}: {exc}", False) from exc
    try:
        json.dumps(output)
    except (TypeError, ValueError) as exc:
        raise ToolError("invalid_output", f"{path} returned a non-JSON value", False) from exc
    return ToolResult(output=output)


def validate_python(params: dict[str, Any]) -> Problems:
    problems = _string(params, "callable")
    path = params.get("callable")
    if isinstance(path, str) and path not in settings.PYTHON_TOOL_ALLOWLIST:
        problems.append(("callable", f"{path!r} is not in PYTHON_TOOL_ALLOWLIST"))
    if "kwargs" in params and not isinstance(params["kwargs"], dict):
        problems.append(("kwargs", "must be an object"))
    return problems


# --------------------------------------------------------------------------- llm
def llm(params: dict[str, Any], ctx: ToolContext) -> ToolResult:
    """OpenAI-compatible chat completion; token usage becomes the cost."""
    base_url = settings.LLM_BASE_URL.rstrip("/")
    if not base_url:
        raise ToolError("tool_error", "LLM_BASE_URL is not configured", False)
    messages = params.get("messages") or [
        {"role": "user", "content": str(params.get("prompt", ""))}
    ]
    body: dict[str, Any] = {
        "model": params.get("model") or settings.LLM_MODEL,
        "messages": messages,
    }
    for key in ("max_tokens", "temperature"):
        if key in params:
            body[key] = params[key]
    headers = {"Authorization": f"Bearer {settings.LLM_API_KEY}"} if settings.LLM_API_KEY else {}
    timeout = float(params.get("timeout", ctx.timeout_s or settings.LLM_TIMEOUT))
    try:
        response = httpx.post(
            f"{base_url}/chat/completions", json=body, headers=headers, timeout=timeout
        )
    except httpx.TimeoutException as exc:
        raise ToolError("llm_timeout", f"LLM request timed out: {exc}") from exc
    except httpx.TransportError as exc:
        raise ToolError("connection_error", f"LLM request failed: {exc}") from exc
    status = response.status_code
    if status == 429:
        raise ToolError("llm_rate_limited", "LLM rate limited (HTTP 429)")
    if status >= 500:
        raise ToolError("llm_service_error", f"LLM service error (HTTP {status})")
    if status in (401, 403):
        raise ToolError("auth_error", f"LLM refused the credentials (HTTP {status})", False)
    if status >= 400:
        raise ToolError(
            "invalid_input",
            f"LLM refused the request (HTTP {status}): {response.text[:500]}",
            False,
        )
    try:
        data = response.json()
        content = data["choices"][0]["message"]["content"]
        usage = data.get("usage") or {}
        tokens = int(usage.get("total_tokens", 0))
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise ToolError("invalid_output", f"unexpected LLM response: {exc}", False) from exc
    return ToolResult(
        output={"content": content, "usage": usage, "model": data.get("model")},
        cost=llm_cost(tokens) if tokens else Decimal(0),
    )


def validate_llm(params: dict[str, Any]) -> Problems:
    if "prompt" not in params and "messages" not in params:
        return [("prompt", "give a prompt or messages")]
    if (
        "messages" in params
        and not has_template(params["messages"])
        and not isinstance(params["messages"], list)
    ):
        return [("messages", "must be a list of {role, content}")]
    return _number(params, "max_tokens", 1, 1_000_000, required=False)


register("noop", noop)
register("echo", echo)
register("sleep", sleep, validate_sleep)
register("fail", fail, validate_fail)
register("http", http, validate_http)
register("python", python, validate_python)
register("llm", llm, validate_llm)
register("approval", None)
