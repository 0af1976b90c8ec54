"""The catalogue of step error codes, and which of them are worth retrying.

Transient network and service errors, rate limits and resource exhaustion are
retryable; bad input, auth, missing things and business refusals are not. A step's
`retry.retry_on` may narrow the retryable set.
"""

from __future__ import annotations

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
