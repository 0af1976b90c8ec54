"""The built-in tools: noop, echo, sleep, wait, fail, http, python, llm (and approval,
which no worker executes). Each validates its parameters for the plan validator, where it can
(a value that is still a `${...}` template is checked only when rendered).

Rendered templates can turn a parameter into anything, so the tools check again at run
time and fail with `invalid_input` (never retried) rather than crash.

A parameter that is a duration (`http`'s and `llm`'s `timeout`, `runner`'s
`match_timeout`, the waiting tools' `timeout` and `interval`) takes the plan's own forms
(`"250ms"`, `"30s"`, `"5m"`, `"1.5h"`, `"7d"` or seconds) and is refused in its words:
one reading, ``runs.plan.durations``, for both. One whose name carries its unit
(`sleep`'s `seconds`) is a number.
"""

from __future__ import annotations

import json
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
from django.conf import settings
from django.utils.module_loading import import_string

from billing.pricing import llm_cost
from common.errors import ERROR_CODES
from common.tools.base import (
    CANCEL_CHECK_INTERVAL,
    ToolContext,
    ToolError,
    ToolResult,
    all_stored,
    has_template,
)
from common.tools.registry import register
from orchestrator import outbound
from orchestrator.netguard import AddressNotAllowed
from runs.plan import DurationRefused, read_duration_ms
from runs.plan.durations import WAIT_MAX_MS, not_a_duration, parse_duration_ms
from runs.plan.errors import listing, show, suggest

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


def _duration(params: dict[str, Any], key: str, minimum_ms: int, maximum_ms: int) -> Problems:
    """An optional duration parameter, checked as the plan's own durations are."""
    if key not in params or has_template(params[key]):
        return []
    try:
        read_duration_ms(params[key], minimum_ms=minimum_ms, maximum_ms=maximum_ms)
    except DurationRefused as exc:
        return [(key, str(exc))]
    return []


def _duration_seconds(
    params: dict[str, Any], key: str, default: float, minimum_ms: int, maximum_ms: int
) -> float:
    """A rendered duration parameter in seconds (``default`` when absent), or
    ToolError('invalid_input') with the plan check's words: a template may have rendered
    to anything."""
    if key not in params:
        return default
    try:
        ms = read_duration_ms(params[key], minimum_ms=minimum_ms, maximum_ms=maximum_ms)
    except DurationRefused as exc:
        raise ToolError("invalid_input", f"{key} {exc}", False) from None
    return ms / 1000


def _string(params: dict[str, Any], key: str, required: bool = True) -> Problems:
    if key not in params:
        return [(key, "is required")] if required else []
    if not isinstance(params[key], str) or not params[key]:
        return [(key, "must be a non-empty string")]
    return []


def _object(params: dict[str, Any], key: str) -> Problems:
    if key in params and not has_template(params[key]) and not isinstance(params[key], dict):
        return [(key, "must be an object")]
    return []


def _seconds(params: dict[str, Any], key: str, default: float) -> float:
    """A rendered number of seconds (a parameter named for its unit, not a duration), or
    ToolError('invalid_input')."""
    value = params.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ToolError("invalid_input", f"{key} must be a number of seconds", False)
    try:
        seconds = float(value)
    except ValueError as exc:
        raise ToolError("invalid_input", f"{key} must be a number of seconds", False) from exc
    if not seconds >= 0 or seconds == float("inf"):  # also rejects NaN
        raise ToolError("invalid_input", f"{key} must be a number of seconds", False)
    return seconds


def _is_json_type(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or media.endswith("+json")


def _reject_constant(name: str) -> Any:
    # NaN and Infinity are not JSON: PostgreSQL refuses them in a jsonb column.
    raise ValueError(f"{name} is not JSON")


def _parse_json(text: str) -> Any:
    return json.loads(text, parse_constant=_reject_constant)


# --------------------------------------------------------------------------- noop, echo
def noop(params: dict[str, Any], ctx: ToolContext) -> ToolResult:
    return ToolResult(output=None)


def echo(params: dict[str, Any], ctx: ToolContext) -> ToolResult:
    """Return the (rendered) params: handy to pass values along and in tests."""
    return ToolResult(output=params)


# --------------------------------------------------------------------------- sleep
def sleep(params: dict[str, Any], ctx: ToolContext) -> ToolResult:
    seconds = _seconds(params, "seconds", 1)
    ctx.sleep(seconds)
    return ToolResult(output={"slept": seconds})


def validate_sleep(params: dict[str, Any]) -> Problems:
    return _number(params, "seconds", 0, 86_400, required=True)


# --------------------------------------------------------------------------- wait
def wait(params: dict[str, Any], ctx: ToolContext) -> ToolResult:
    """A wait step's time has come (``runs.admission.step_admission.timer`` parked it until then,
    holding no worker, and charged its time as it parked; the claim that woke it runs
    this): it completes, with nothing more to pay."""
    return ToolResult(output={"woke_at": datetime.now(UTC).isoformat()})


def wait_time(params: dict[str, Any], now: datetime) -> tuple[datetime | None, int | None]:
    """A wait's rendered ``until`` (an aware time) or ``for`` (milliseconds), or
    ToolError('invalid_input') in the plan check's words."""
    problems = validate_wait(params, now=now, rendered=True)
    if problems:
        key, problem = problems[0]
        raise ToolError("invalid_input", f"{key} {problem}", False)
    if "until" in params:
        return _until(params["until"]), None
    return None, parse_duration_ms(params["for"])


def _until(value: Any) -> datetime:
    """An RFC 3339 time with its offset (``2026-12-01T09:00:00Z``), or ValueError."""
    if not isinstance(value, str):
        raise ValueError("not a string")
    when = datetime.fromisoformat(value)
    if when.tzinfo is None:
        raise ValueError("no offset")
    return when


def validate_wait(
    params: dict[str, Any], *, now: datetime | None = None, rendered: bool = False
) -> Problems:
    """Exactly one of ``for`` (a duration) and ``until`` (an RFC 3339 time), at most 366
    days ahead; a template is checked once rendered (``wait_time``)."""
    unknown = sorted(set(params) - {"for", "until"})
    problems: Problems = [(key, "is not a parameter of the wait tool") for key in unknown]
    given = [key for key in ("for", "until") if key in params]
    if len(given) != 1:
        return [*problems, ("for", "give one of for (a duration) or until (an RFC 3339 time)")]
    key = given[0]
    value = params[key]
    if not rendered and has_template(value):
        return problems
    if key == "for":
        # Its own bounds: read_duration_ms holds every other duration to a year.
        ms = parse_duration_ms(value)
        if ms is None:
            problems.append((key, not_a_duration(value)))
        elif ms > WAIT_MAX_MS:
            problems.append((key, f"must be at most 366d, got {show(value)}"))
        return problems
    try:
        when = _until(value)
    except ValueError:
        return [*problems, (key, f"must be an RFC 3339 time with its offset, got {show(value)}")]
    if when - (now or datetime.now(UTC)) > timedelta(milliseconds=WAIT_MAX_MS):
        problems.append((key, f"must be at most 366d ahead, got {show(value)}"))
    return problems


# --------------------------------------------------------------------------- runner
RUNNER_JOB_TYPES = ("start_session", "resume_session")
RUNNER_DEMANDS = ("hostname", "project_dir", "executor_type")
# How long a job may wait for a matching runner: a second to a day.
RUNNER_MATCH_TIMEOUT_MS = (1_000, 86_400_000)


def runner(params: dict[str, Any], ctx: ToolContext) -> ToolResult:
    """Hand the attempt to an external runner (docs/runners.md): the step waits, with no
    worker, for the job's report. Parameters are checked again as rendered."""
    problems = validate_runner(params, rendered=True)
    if problems:
        raise ToolError("invalid_input", "; ".join(f"{k} {m}" for k, m in problems), False)
    wait = {
        "kind": "runner_job",
        "prompt": params["prompt"],
        "type": params.get("type", "start_session"),
        "session_id": params.get("session_id") or "",
        "agent_name": params.get("agent_name") or "",
        "project_dir": params.get("project_dir") or "",
        "demands": params.get("demands") or {},
        # In seconds, as the job's creation reads it; None: RUNNER_MATCH_TIMEOUT.
        "match_timeout": (
            _duration_seconds(params, "match_timeout", 0, *RUNNER_MATCH_TIMEOUT_MS)
            if "match_timeout" in params
            else None
        ),
    }
    return ToolResult(wait=wait)


def validate_runner(params: dict[str, Any], rendered: bool = False) -> Problems:
    """The plan's check (templates pass until rendered) and, ``rendered``, the worker's."""

    def later(key: str) -> bool:
        return not rendered and has_template(params.get(key))

    problems: Problems = []
    unknown = sorted(
        set(params)
        - {"prompt", "type", "session_id", "agent_name", "project_dir", "demands", "match_timeout"}
    )
    problems += [(key, "is not a parameter of the runner tool") for key in unknown]
    problems += _string(params, "prompt")
    kind = params.get("type", "start_session")
    if not later("type") and kind not in RUNNER_JOB_TYPES:
        problems.append(("type", "must be start_session or resume_session"))
    for key in ("session_id", "agent_name", "project_dir"):
        if key in params and not later(key) and not isinstance(params[key], str):
            problems.append((key, "must be a string"))
    if kind == "resume_session" and not params.get("session_id"):
        problems.append(("session_id", "is required to resume a session"))
    problems += _duration(params, "match_timeout", *RUNNER_MATCH_TIMEOUT_MS)
    demands = params.get("demands")
    if demands is not None and not later("demands"):
        if not isinstance(demands, dict):
            problems.append(("demands", "must be an object"))
        else:
            for key in sorted(set(demands) - {*RUNNER_DEMANDS, "tags"}):
                problems.append((f"demands.{key}", "is not a demand"))
            for key in RUNNER_DEMANDS:
                if (
                    key in demands
                    and demands[key] is not None
                    and not isinstance(demands[key], str)
                ):
                    problems.append((f"demands.{key}", "must be a string"))
            tags = demands.get("tags")
            if tags is not None and (
                not isinstance(tags, list) or not all(isinstance(tag, str) for tag in tags)
            ):
                problems.append(("demands.tags", "must be a list of strings"))
    return problems


# --------------------------------------------------------------------------- fail
def fail(params: dict[str, Any], ctx: ToolContext) -> ToolResult:
    """Fail with a chosen code; with `until_attempt: N`, only attempts 1..N fail."""
    until = params.get("until_attempt")
    if until is not None:
        try:
            until = int(until)
        except (TypeError, ValueError) as exc:
            raise ToolError("invalid_input", "until_attempt must be a whole number", False) from exc
        if ctx.attempt > until:
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
        hint = suggest(code, ERROR_CODES) if isinstance(code, str) else ""
        problems.append(
            ("code", f"unknown error code {code!r}{hint}; the codes: {listing(ERROR_CODES)}")
        )
    retryable = params.get("retryable")
    if "retryable" in params and not has_template(retryable) and not isinstance(retryable, bool):
        problems.append(("retryable", "must be true or false"))
    return problems


# --------------------------------------------------------------------------- http
HTTP_RETRYABLE = {
    408: "timeout",
    429: "rate_limited",
    502: "bad_gateway",
    503: "service_unavailable",
    504: "gateway_timeout",
}
HTTP_NON_RETRYABLE = {401: "auth_error", 403: "permission_denied", 404: "not_found"}
HTTP_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE", "HEAD")
HTTP_MAX_REDIRECTS = 5
# The bounds of `timeout` (also the llm tool's): a millisecond to an hour.
HTTP_TIMEOUT_MS = (1, 3_600_000)
# How much of an error response's body its ToolError message quotes.
HTTP_ERROR_EXCERPT = 300


def _http_request(params: dict[str, Any]) -> tuple[str, str, dict[str, Any]]:
    """Method, URL and httpx keyword arguments from rendered params (or invalid_input)."""
    url = params.get("url")
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise ToolError("invalid_input", f"url must be an http(s) URL, got {url!r}", False)
    method = str(params.get("method", "GET")).upper()
    if method not in HTTP_METHODS:
        raise ToolError("invalid_input", f"method must be one of {', '.join(HTTP_METHODS)}", False)
    for key in ("headers", "query"):
        if params.get(key) is not None and not isinstance(params[key], dict):
            raise ToolError("invalid_input", f"{key} must be an object", False)
    body = params.get("body")
    if body is not None and not isinstance(body, str):
        raise ToolError("invalid_input", "body must be a string (use json for data)", False)
    return (
        method,
        url,
        {
            "headers": params.get("headers") or {},
            "params": params.get("query") or None,
            "json": params.get("json"),
            "content": body,
        },
    )


def http(params: dict[str, Any], ctx: ToolContext) -> ToolResult:
    """One HTTP request (``_exchange``); with ``save_as``, its response body is kept as
    an artifact, through a spool file that ends with the request."""
    save_as = params.get("save_as")
    if save_as is None:
        return _exchange(params, ctx, None)
    if not isinstance(save_as, str) or not save_as.strip():
        raise ToolError("invalid_input", "save_as must be an artifact name", False)
    with tempfile.SpooledTemporaryFile(max_size=1024 * 1024) as spool:
        return _exchange(params, ctx, spool)


def _exchange(params: dict[str, Any], ctx: ToolContext, spool: Any) -> ToolResult:
    """One HTTP request; redirects are followed only with `follow_redirects: true` (at most
    HTTP_MAX_REDIRECTS hops), otherwise a 3xx is returned like a 2xx.

    The request is ``orchestrator.outbound``'s: every connection, each redirect hop
    included, goes through the address guard (a loopback, private, link-local...
    address fails the step at once with `address_not_allowed`, never retried); `timeout`
    bounds the whole exchange, from the name's look-up to the body's last byte; the body
    is decoded as it is read and capped in decoded bytes. A JSON body (by content type)
    is parsed, any other body is returned as text. Error statuses raise the matching code
    (HTTP_RETRYABLE, HTTP_NON_RETRYABLE, server_error, invalid_input).
    """
    method, url, request = _http_request(params)
    timeout = _duration_seconds(params, "timeout", ctx.timeout_s or 30, *HTTP_TIMEOUT_MS)
    follow = params.get("follow_redirects", False)
    if not isinstance(follow, bool):
        raise ToolError("invalid_input", "follow_redirects must be true or false", False)
    # Kept as an artifact, the body may be as large as an artifact, and goes to disk
    # beyond a megabyte rather than into memory.
    save_as = params["save_as"].strip() if spool is not None else ""
    limit = settings.ARTIFACT_MAX_FILE_BYTES if save_as else settings.HTTP_TOOL_MAX_RESPONSE_BYTES
    body: Any = spool if save_as else bytearray()
    received = 0
    next_stop_check = time.monotonic() + CANCEL_CHECK_INTERVAL
    try:
        with outbound.exchange(
            method,
            url,
            deadline=time.monotonic() + timeout,
            follow_redirects=follow,
            max_redirects=HTTP_MAX_REDIRECTS,
            **request,
        ) as response:
            for chunk in outbound.body(response, limit):
                if save_as:
                    body.write(chunk)
                else:
                    body.extend(chunk)
                received += len(chunk)
                # stop_requested may query the database: ask at most once per interval.
                now = time.monotonic()
                if now >= next_stop_check:
                    next_stop_check = now + CANCEL_CHECK_INTERVAL
                    if ctx.stop_requested():
                        raise ToolError("cancelled", "the step was cancelled while running", False)
    except AddressNotAllowed as exc:
        raise ToolError("address_not_allowed", str(exc), False) from exc
    except outbound.TooLarge as exc:
        raise ToolError("invalid_output", str(exc)) from exc
    except outbound.Undecodable as exc:
        raise ToolError("invalid_output", f"HTTP response cannot be decoded: {exc}") from exc
    except httpx.TooManyRedirects as exc:
        message = f"more than {HTTP_MAX_REDIRECTS} redirects"
        raise ToolError("invalid_output", message, False) from exc
    except httpx.TimeoutException as exc:
        message = f"HTTP request timed out: no whole answer within {timeout:g}s ({exc})"
        raise ToolError("timeout", message) from exc
    except (httpx.UnsupportedProtocol, httpx.LocalProtocolError, httpx.InvalidURL) as exc:
        raise ToolError("invalid_input", f"HTTP request is invalid: {exc}", False) from exc
    except httpx.TransportError as exc:
        raise ToolError("connection_error", f"HTTP request failed: {exc}") from exc
    except (TypeError, ValueError) as exc:  # httpx refusing a header or body value
        raise ToolError("invalid_input", f"HTTP request is invalid: {exc}", False) from exc
    status = response.status_code
    if save_as:
        body.seek(0)
        text = outbound.text(response, body.read(HTTP_ERROR_EXCERPT * 4))
    else:
        text = outbound.text(response, bytes(body))
    if status >= 400:
        excerpt = text[:HTTP_ERROR_EXCERPT].strip()
        message = f"HTTP {status}: {excerpt}" if excerpt else f"HTTP {status}"
        if status in HTTP_RETRYABLE:
            raise ToolError(HTTP_RETRYABLE[status], message)
        if status >= 500:
            raise ToolError("server_error", message)
        raise ToolError(HTTP_NON_RETRYABLE.get(status, "invalid_input"), message, False)
    if save_as:
        body.seek(0)
        content_type = response.headers.get("content-type", "application/octet-stream")
        saved = ctx.save_artifact(save_as, body, received, content_type)
        return ToolResult(
            output={"status": status, "headers": dict(response.headers), "artifact": saved}
        )
    parsed: Any = text
    if text and _is_json_type(response.headers.get("content-type", "")):
        try:
            parsed = _parse_json(text)
        except ValueError:
            parsed = text  # says JSON but is not: keep what was sent
    elif not text:
        parsed = None
    return ToolResult(output={"status": status, "headers": dict(response.headers), "body": parsed})


def validate_http(params: dict[str, Any]) -> Problems:
    problems = _string(params, "url")
    url = params.get("url")
    if (
        isinstance(url, str)
        and url
        and not has_template(url)
        and not url.startswith(("http://", "https://"))
    ):
        problems.append(("url", "must be an http:// or https:// URL"))
    method = params.get("method", "GET")
    if not has_template(method) and str(method).upper() not in HTTP_METHODS:
        problems.append(("method", f"must be one of {', '.join(HTTP_METHODS)}"))
    problems += _duration(params, "timeout", *HTTP_TIMEOUT_MS)
    problems += _object(params, "headers")
    problems += _object(params, "query")
    if params.get("body") is not None and not isinstance(params["body"], str):
        problems.append(("body", "must be a string (use json for data)"))
    follow = params.get("follow_redirects", False)
    if not has_template(follow) and not isinstance(follow, bool):
        problems.append(("follow_redirects", "must be true or false"))
    if "json" in params and "body" in params:
        problems.append(("body", "give either json or body, not both"))
    save_as = params.get("save_as")
    if (
        save_as is not None
        and not has_template(save_as)
        and (not isinstance(save_as, str) or not save_as.strip() or len(save_as) > 255)
    ):
        problems.append(("save_as", "must be an artifact name (1 to 255 characters)"))
    return problems


# --------------------------------------------------------------------------- python
def python(params: dict[str, Any], ctx: ToolContext) -> ToolResult:
    """Call an allow-listed callable with `kwargs`; its return value is the output."""
    path = params.get("callable")
    if not isinstance(path, str) or not path:
        raise ToolError("invalid_input", "callable must be a dotted path", False)
    if path not in settings.PYTHON_TOOL_ALLOWLIST:
        raise ToolError("permission_denied", f"{path} is not in PYTHON_TOOL_ALLOWLIST", False)
    kwargs = params.get("kwargs") or {}
    if not isinstance(kwargs, dict):
        raise ToolError("invalid_input", "kwargs must be an object", False)
    try:
        function = import_string(path)
    except ImportError as exc:
        raise ToolError("not_found", f"cannot import {path}: {exc}", False) from exc
    try:
        output = function(**kwargs)
    except ToolError:
        raise
    except (TypeError, ValueError) as exc:
        raise ToolError("invalid_input", f"{path}: {exc}", False) from exc
    try:
        json.dumps(output, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ToolError("invalid_output", f"{path} returned a non-JSON value", False) from exc
    return ToolResult(output=output)


def validate_python(params: dict[str, Any]) -> Problems:
    problems = _string(params, "callable")
    path = params.get("callable")
    if (
        isinstance(path, str)
        and path
        and not has_template(path)
        and path not in settings.PYTHON_TOOL_ALLOWLIST
    ):
        problems.append(("callable", f"{path!r} is not in PYTHON_TOOL_ALLOWLIST"))
    return problems + _object(params, "kwargs")


# --------------------------------------------------------------------------- llm
def _llm_tokens(usage: Any) -> int:
    if not isinstance(usage, dict):
        raise TypeError("usage is not an object")
    if "total_tokens" in usage:
        tokens = usage["total_tokens"]
    else:
        tokens = usage.get("prompt_tokens", 0) + usage.get("completion_tokens", 0)
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
        raise ValueError(f"token count {tokens!r} is not a whole number >= 0")
    return tokens


def llm(params: dict[str, Any], ctx: ToolContext) -> ToolResult:
    """OpenAI-compatible chat completion; token usage becomes the cost."""
    messages = params.get("messages") or [
        {"role": "user", "content": str(params.get("prompt", ""))}
    ]
    if not isinstance(messages, list):
        raise ToolError("invalid_input", "messages must be a list of {role, content}", False)
    extra = {key: params[key] for key in ("max_tokens", "temperature") if key in params}
    timeout = _duration_seconds(
        params, "timeout", ctx.timeout_s or settings.LLM_TIMEOUT, *HTTP_TIMEOUT_MS
    )
    reply = chat_completion(messages, model=params.get("model"), timeout=timeout, **extra)
    return ToolResult(
        output={"content": reply.content, "usage": reply.usage, "model": reply.model},
        cost=llm_cost(reply.tokens),
    )


@dataclass(frozen=True)
class ChatReply:
    content: Any
    usage: dict[str, Any]
    tokens: int
    model: Any


def chat_completion(
    messages: list[Any], *, model: str | None = None, timeout: float, **extra: Any
) -> ChatReply:
    """One call to the OpenAI-compatible endpoint at LLM_BASE_URL (the `llm` tool's, and
    the LLM planner's); its failures are ToolErrors with the tool's codes."""
    base_url = settings.LLM_BASE_URL.rstrip("/")
    if not base_url:
        raise ToolError("tool_error", "LLM_BASE_URL is not configured", False)
    body: dict[str, Any] = {"model": model or settings.LLM_MODEL, "messages": messages, **extra}
    headers = {"Authorization": f"Bearer {settings.LLM_API_KEY}"} if settings.LLM_API_KEY else {}
    try:
        response = httpx.post(
            f"{base_url}/chat/completions", json=body, headers=headers, timeout=timeout
        )
    except httpx.TimeoutException as exc:
        raise ToolError("llm_timeout", f"LLM request timed out: {exc}") from exc
    except (httpx.UnsupportedProtocol, httpx.InvalidURL) as exc:
        raise ToolError("tool_error", f"LLM_BASE_URL is not usable: {exc}", False) from exc
    except httpx.TransportError as exc:
        raise ToolError("connection_error", f"LLM request failed: {exc}") from exc
    status = response.status_code
    if status == 408:
        raise ToolError("llm_timeout", "LLM request timed out (HTTP 408)")
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
        data = _parse_json(response.text)
        content = data["choices"][0]["message"]["content"]
        usage = data.get("usage") or {}
        tokens = _llm_tokens(usage)
    except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
        raise ToolError("invalid_output", f"unexpected LLM response: {exc}", False) from exc
    return ChatReply(content, usage, tokens, data.get("model"))


def validate_llm(params: dict[str, Any]) -> Problems:
    problems: Problems = []
    if "prompt" not in params and "messages" not in params:
        problems.append(("prompt", "give a prompt or messages"))
    if "prompt" in params and not isinstance(params["prompt"], str):
        problems.append(("prompt", "must be a string"))
    messages = params.get("messages")
    if "messages" in params and not has_template(messages):
        if not isinstance(messages, list) or not messages:
            problems.append(("messages", "must be a non-empty list of {role, content}"))
        else:
            for i, message in enumerate(messages):
                if has_template(message):
                    continue
                if not isinstance(message, dict) or "role" not in message:
                    problems.append((f"messages[{i}]", "must be an object with role and content"))
    problems += _number(params, "max_tokens", 1, 1_000_000, required=False)
    problems += _number(params, "temperature", 0, 2, required=False)
    problems += _duration(params, "timeout", *HTTP_TIMEOUT_MS)
    return problems


register("noop", noop)
register("echo", echo)
register("sleep", sleep, validate_sleep)
register("fail", fail, validate_fail)
register("http", http, validate_http)
register("python", python, validate_python)
register("llm", llm, validate_llm)
register("approval", None)
# A runner job keeps its parameters, and its prompt goes to another host; a wait's time
# is shown in its event: neither may read a secret.
register("runner", runner, validate_runner, stored=all_stored)
register("wait", wait, validate_wait, stored=all_stored)
