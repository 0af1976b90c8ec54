"""The tools whose step waits outside the worker for something else to end
(docs/runners.md): `run` (a child run), `callback` (a URL someone posts to) and `poll` (a
URL the engine reads until a condition holds). Each returns a wait; the recording parks
the step (``runs.engine.waiting``) and what ends the wait records the attempt's outcome.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings

from common.expressions import Expression, ExpressionError
from common.templates import TemplateError
from common.tools.base import ToolContext, ToolError, ToolResult, all_stored, has_template
from common.tools.registry import register
from orchestrator.tools.builtin import (
    Problems,
    _duration,
    _duration_seconds,
    _http_request,
    _number,
    _object,
    _string,
    http,
    validate_http,
)
from runs.plan import PlanInvalid, parse_plan, seconds_ms

# --------------------------------------------------------------------------- run
RUN_MODES = ("sync", "async_poll", "async_callback")
RUN_PARAMS = {"plan", "execution_mode", "variables"}


def run_verbatim(params: dict[str, Any]) -> frozenset[str]:
    """A child plan written out is the child's, templates included: the parent renders
    a `plan` only when it is a template (``${variables.sub}``)."""
    return frozenset({"plan"}) if isinstance(params.get("plan"), dict) else frozenset()


def run_stored(params: dict[str, Any]) -> frozenset[str]:
    """The child run keeps its variables, and a templated plan as rendered: the parent
    cannot hand it a secret's value (the child reads ``${secrets.NAME}`` itself, in the
    plan written out)."""
    return frozenset({"variables", "plan"}) - run_verbatim(params)


def child_run(params: dict[str, Any], ctx: ToolContext) -> ToolResult:
    """Start a child run; the recording creates it, in the parent's transaction."""
    plan = params.get("plan")
    if not isinstance(plan, dict):
        kind = type(plan).__name__
        raise ToolError("invalid_plan", f"plan must be an object (a run plan), got {kind}", False)
    variables = params.get("variables") or {}
    if not isinstance(variables, dict):
        raise ToolError("invalid_input", "variables must be an object", False)
    mode = params.get("execution_mode", "sync")
    if mode not in RUN_MODES:
        raise ToolError("invalid_input", f"execution_mode must be one of {RUN_MODES}", False)
    return ToolResult(
        wait={"kind": "child_run", "plan": plan, "variables": variables, "mode": mode}
    )


def literal_nesting(plan: dict[str, Any]) -> int:
    """How many levels of child plans are written inside ``plan`` (0: none). Iterative:
    the plan's depth is bounded before this runs, but not its width."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(plan, 0)]
    while stack:
        item, level = stack.pop()
        deepest = max(deepest, level)
        for agent in _list(item.get("agents")):
            for task in _list(agent.get("tasks") if isinstance(agent, dict) else None):
                for step in _list(task.get("steps") if isinstance(task, dict) else None):
                    for node in _steps_and_handlers(step):
                        params = node.get("params")
                        if node.get("tool") == "run" and isinstance(params, dict):
                            child = params.get("plan")
                            if isinstance(child, dict):
                                stack.append((child, level + 1))
    return deepest


def _list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else []


def _steps_and_handlers(step: Any) -> list[dict[str, Any]]:
    if not isinstance(step, dict):
        return []
    handlers = [*_list(step.get("on_error")), *_list(step.get("on_callback"))]
    return [step, *(h for h in handlers if isinstance(h, dict))]


def validate_run(params: dict[str, Any]) -> Problems:
    """The child plan, when written out, is validated as a plan of its own (its problems
    under ``plan.``), and its literal nesting against RUN_MAX_DEPTH; a templated one is
    validated when the step runs."""
    problems: Problems = [
        (key, "is not a parameter of the run tool") for key in sorted(set(params) - RUN_PARAMS)
    ]
    mode = params.get("execution_mode", "sync")
    if mode not in RUN_MODES:
        problems.append(("execution_mode", f"must be one of {', '.join(RUN_MODES)}"))
    problems += _object(params, "variables")
    if "plan" not in params:
        return [*problems, ("plan", "is required")]
    plan = params["plan"]
    if isinstance(plan, str) and has_template(plan):
        return problems
    if not isinstance(plan, dict):
        return [*problems, ("plan", "must be a run plan (an object) or a template of one")]
    levels = 1 + literal_nesting(plan)
    if levels > settings.RUN_MAX_DEPTH:
        problems.append(
            (
                "plan",
                f"child runs are written {levels} levels deep here; at most RUN_MAX_DEPTH "
                f"({settings.RUN_MAX_DEPTH}) allowed",
            )
        )
        return problems
    try:
        parse_plan(plan)
    except PlanInvalid as exc:
        problems += [(f"plan.{e.path}" if e.path else "plan", e.message) for e in exc.errors]
    return problems


# --------------------------------------------------------------------------- callback
CALLBACK_PARAMS = {"request", "timeout"}


def _wait_timeout_ms() -> tuple[int, int]:
    """The bounds of a callback's or a poll's `timeout`: a millisecond to
    CALLBACK_MAX_TIMEOUT (read when checked: tests change it)."""
    return 1, seconds_ms(settings.CALLBACK_MAX_TIMEOUT)


def callback(params: dict[str, Any], ctx: ToolContext) -> ToolResult:
    """Open a single-use callback URL (``${callback.url}``), send the request that hands
    it out if there is one, and wait for a post to the URL.

    The URL is open before the request leaves: a service that answers at once finds it.
    """
    default = ctx.timeout_s or settings.ENGINE_DEFAULT_STEP_TIMEOUT
    timeout = _duration_seconds(params, "timeout", default, *_wait_timeout_ms())
    request = params.get("request")
    if request is not None and not isinstance(request, dict):
        raise ToolError("invalid_input", "request must be an object (an http request)", False)
    if request is not None:
        _http_request(request)  # refused before the URL is opened
    opened = ctx.open_callback(min(timeout, settings.CALLBACK_MAX_TIMEOUT))
    sent = http(request, ctx).output if request is not None else None
    # Of the answer, only its status goes on (its event shows it): the rest may echo what
    # the request sent, a secret's value included, and a wait is not redacted.
    answer = {"status": sent["status"]} if isinstance(sent, dict) else None
    return ToolResult(wait={"kind": "callback", **opened, "request": answer})


def validate_callback(params: dict[str, Any]) -> Problems:
    problems: Problems = [
        (key, "is not a parameter of the callback tool")
        for key in sorted(set(params) - CALLBACK_PARAMS)
    ]
    problems += _duration(params, "timeout", *_wait_timeout_ms())
    request = params.get("request")
    if request is not None and not has_template(request):
        if not isinstance(request, dict):
            problems.append(("request", "must be an http request (an object)"))
        else:
            problems += [(f"request.{key}", message) for key, message in validate_http(request)]
    return problems


# --------------------------------------------------------------------------- poll
POLL_PARAMS = {
    "url",
    "headers",
    "query",
    "interval",
    "max_attempts",
    "timeout",
    "done_when",
    "failed_when",
}
POLL_CONDITIONS = ("done_when", "failed_when")
RESPONSE_FIELDS = ("status", "body", "headers", "error")
POLL_MAX_INTERVAL_MS = 86_400_000


def _poll_interval_ms() -> tuple[int, int]:
    """The bounds of a poll's `interval`: POLL_MIN_INTERVAL to a day."""
    return seconds_ms(settings.POLL_MIN_INTERVAL), POLL_MAX_INTERVAL_MS


def poll_verbatim(params: dict[str, Any]) -> frozenset[str]:
    """The conditions read the response (``${response.status}``), which exists only
    when the engine polls: they are not the plan's templates."""
    return frozenset(POLL_CONDITIONS)


def poll(params: dict[str, Any], ctx: ToolContext) -> ToolResult:
    """Hand the polling to the engine: scheduled messages, no worker held between them."""
    problems = validate_poll(params, rendered=True)
    if problems:
        raise ToolError("invalid_input", "; ".join(f"{k} {m}" for k, m in problems), False)
    # Durations in seconds from here on: the wait's poll schedule reads them so.
    interval = _duration_seconds(params, "interval", 5, *_poll_interval_ms())
    max_attempts = int(params.get("max_attempts", 60))
    default_timeout = interval * max_attempts + (ctx.timeout_s or 0)
    timeout = _duration_seconds(params, "timeout", default_timeout, *_wait_timeout_ms())
    wait = {
        "kind": "poll",
        "url": params["url"],
        "headers": params.get("headers") or {},
        "query": params.get("query") or {},
        "interval": interval,
        "max_attempts": max_attempts,
        "timeout": timeout,
        "done_when": params["done_when"],
        "failed_when": params.get("failed_when") or "",
    }
    return ToolResult(wait=wait)


def validate_poll(params: dict[str, Any], rendered: bool = False) -> Problems:
    problems: Problems = [
        (key, "is not a parameter of the poll tool") for key in sorted(set(params) - POLL_PARAMS)
    ]
    problems += _string(params, "url")
    url = params.get("url")
    if (
        isinstance(url, str)
        and not has_template(url)
        and not url.startswith(("http://", "https://"))
    ):
        problems.append(("url", "must be an http(s) URL"))
    for key in ("headers", "query"):
        problems += _object(params, key)
        if rendered and key in params and not isinstance(params[key], dict):
            problems.append((key, "must be an object"))
    problems += _duration(params, "interval", *_poll_interval_ms())
    problems += _number(params, "max_attempts", 1, 100_000, required=False)
    problems += _duration(params, "timeout", *_wait_timeout_ms())
    if "done_when" not in params:
        problems.append(("done_when", "is required"))
    for key in POLL_CONDITIONS:
        if key in params and not (key == "failed_when" and params[key] in ("", None)):
            problems += _condition(params[key], key)
    return problems


def _condition(source: Any, key: str) -> Problems:
    if not isinstance(source, str) or not source.strip():
        return [(key, "must be a condition on the response, e.g. ${response.status} == 200")]
    try:
        expression = Expression.parse(source)
    except (ExpressionError, TemplateError) as exc:
        return [(key, f"bad condition: {exc}")]
    problems: Problems = []
    for ref in expression.references:
        if ref[0] != "response" or len(ref) < 2 or ref[1] not in RESPONSE_FIELDS:
            problems.append(
                (key, f"a poll condition reads only response.{{{','.join(RESPONSE_FIELDS)}}}")
            )
    return problems


register("run", child_run, validate_run, run_verbatim, run_stored)
register("callback", callback, validate_callback)
# What a poll is given is kept with its wait, to poll again after a restart.
register("poll", poll, validate_poll, poll_verbatim, all_stored)
