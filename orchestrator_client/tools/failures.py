"""How a tool's failure reads to the engine: an error code, a message, and whether the
step's retry policy may try again.

The codes are the engine's (docs/api.md, "Step errors"), written here, once: this package
imports nothing of the server, and the server reads them from here (``common.errors``). A
tool raises ``ToolFailure`` with one of them, or declares which of its own
exceptions mean which code (``@tool(errors={TimeoutError: "timeout"})``); anything else it
raises is ``tool_error``, not retried, as a crash of a built-in tool is.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

RETRYABLE_CODES = frozenset(
    {
        "timeout",
        "connection_error",
        "rate_limited",
        "bad_gateway",
        "service_unavailable",
        "gateway_timeout",
        "server_error",
        "resource_exhausted",
        "llm_rate_limited",
        "llm_timeout",
        "llm_service_error",
        "worker_lost",
        "transient",
        # Runner jobs (docs/runners.md): a runner reported a failure, or went silent.
        "runner_failed",
        "runner_lost",
        # A callback step's callback said it failed (docs/runners.md, "Callbacks").
        "callback_failed",
    }
)

NON_RETRYABLE_CODES = frozenset(
    {
        "invalid_input",
        "invalid_output",
        "auth_error",
        "permission_denied",
        "not_found",
        "insufficient_credits",
        "budget_exhausted",
        "quota_exceeded",
        "tool_error",
        "template_error",
        "condition_error",
        "approval_rejected",
        "cancelled",
        "attempt_budget_exhausted",
        "failure_budget_exhausted",
        "dependency_failed",
        "address_not_allowed",
        "runner_stopped",
        "no_matching_runner",
        # Child runs: the child has its own retries and failure modes; a child plan
        # that does not validate, or that would nest too deep, never will.
        "child_failed",
        "child_cancelled",
        "invalid_plan",
        "run_depth_exceeded",
        # Rate limits (docs/rate-limits.md): a step's units, rendered, exceed its limit.
        "rate_limit_exceeded",
        # Polls: failed_when held, or max_attempts polls without done_when holding.
        "poll_failed",
        "poll_exhausted",
    }
)

ERROR_CODES = RETRYABLE_CODES | NON_RETRYABLE_CODES


def is_retryable(code: str) -> bool:
    return code in RETRYABLE_CODES


class ToolFailure(Exception):
    """Raised by a tool (or made from what it raised): the step's attempt fails with
    ``code``; ``retryable`` defaults to the code's own (``RETRYABLE_CODES``)."""

    def __init__(self, code: str, message: str, *, retryable: bool | None = None) -> None:
        if code not in ERROR_CODES:
            known = ", ".join(sorted(ERROR_CODES))
            raise ValueError(f"unknown error code {code!r}; one of: {known}")
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.retryable = is_retryable(code) if retryable is None else retryable

    def as_dict(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "retryable": self.retryable}


class Cancelled(Exception):
    """The step was cancelled (its run cancelled, its timeout passed, the job stopped):
    raised by ``Context.heartbeat`` and ``Context.sleep`` once a stop was asked for. Let
    it propagate; the attempt ends as stopped (``cancelled``), and what the function
    returns afterwards is not recorded."""


def classify(
    exc: BaseException, declared: Mapping[type[BaseException], str] | None = None
) -> ToolFailure:
    """What ``exc`` means to the engine: a ``ToolFailure`` as raised, ``cancelled`` for
    ``Cancelled``, the code declared for its class (the nearest in its MRO), else
    ``tool_error`` with the exception's type and text."""
    if isinstance(exc, ToolFailure):
        return exc
    if isinstance(exc, Cancelled):
        return ToolFailure("cancelled", str(exc) or "the step was cancelled", retryable=False)
    text = str(exc) or type(exc).__name__
    for kind in type(exc).__mro__:
        if declared and kind in declared:
            return ToolFailure(declared[kind], f"{type(exc).__name__}: {text}")
    return ToolFailure("tool_error", f"{type(exc).__name__}: {text}", retryable=False)
