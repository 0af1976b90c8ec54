"""What goes wrong, as exceptions a caller can catch by kind and read by field.

Every error the API answers is JSON ``{"code", "message", "details"}`` with a stable
``code`` (docs/api.md, "Errors"); ``ApiError`` carries those and the HTTP ``status``,
and ``retry_after`` (seconds) when the answer said when to try again. Its subclass is
chosen by ``code`` first (``InvalidPlan``, ``InvalidTransition``...), then by status
(``NotFound``, ``Conflict``...), so ``except NotFound`` and ``except ApiError`` both work.
A server that could not be reached is ``TransportError``, once the retries are spent.
"""

from __future__ import annotations

from typing import Any


class OrchestratorError(Exception):
    """The root of everything this package raises."""

    code: str = "error"
    details: Any = None
    status: int | None = None

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class TransportError(OrchestratorError):
    """The server could not be reached, or the connection broke (after every retry)."""

    code = "connection_failed"


class ApiError(OrchestratorError):
    """An error answer of the API (4xx or 5xx)."""

    def __init__(
        self,
        *,
        status: int,
        code: str,
        message: str,
        details: Any = None,
        retry_after: float | None = None,
        body: Any = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.details = details
        self.retry_after = retry_after
        self.body = body  # the decoded answer as it came (or its text, when not JSON)

    def __str__(self) -> str:
        return f"{self.status} {self.code}: {self.message}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}(status={self.status}, code={self.code!r})"


class BadRequest(ApiError):
    """400: the request is malformed (``invalid_request``, ``invalid_json``...)."""


class InvalidPlan(BadRequest):
    """400 ``invalid_plan``: ``details`` lists every problem as ``{path, message}``."""


class AuthenticationFailed(ApiError):
    """401: no API key, or an unknown, malformed or revoked one."""


class InsufficientCredits(ApiError):
    """402: the organization cannot cover the reservation (``details``: needed, available)."""


class PermissionDenied(ApiError):
    """403: the key's scope does not allow this route (``insufficient_scope``), or an
    operator suspended its organization (``organization_suspended``)."""


class NotFound(ApiError):
    """404: no such run, step, secret... in your organization (or no such route)."""


class Conflict(ApiError):
    """409: the request does not fit the current state."""


class InvalidTransition(Conflict):
    """409 ``invalid_transition``: ``details`` is ``{entity, from, to}``."""


class QuotaExceeded(Conflict):
    """409 ``quota_exceeded``: one more webhook endpoint, schedule or rate limit than the
    organization's quota; ``details`` is ``{quota, limit}``."""


class IdempotencyKeyReused(ApiError):
    """422 ``idempotency_key_reused``: the key was used before with another body."""


class RateLimited(ApiError):
    """429: ``throttled``, ``too_many_pending_runs``, ``too_many_streams`` or
    ``too_many_pending_deliveries``; ``retry_after`` says when to retry."""


class ServerError(ApiError):
    """5xx: the server failed (``internal_error``) or is unavailable for now."""


BY_CODE: dict[str, type[ApiError]] = {
    "invalid_plan": InvalidPlan,
    "invalid_transition": InvalidTransition,
    "insufficient_credits": InsufficientCredits,
    "quota_exceeded": QuotaExceeded,
    "idempotency_key_reused": IdempotencyKeyReused,
}
BY_STATUS: dict[int, type[ApiError]] = {
    400: BadRequest,
    401: AuthenticationFailed,
    402: InsufficientCredits,
    403: PermissionDenied,
    404: NotFound,
    409: Conflict,
    422: IdempotencyKeyReused,
    429: RateLimited,
}


def error_class(status: int, code: str) -> type[ApiError]:
    """The most specific exception class for an answer's ``status`` and ``code``."""
    if code in BY_CODE:
        return BY_CODE[code]
    if status in BY_STATUS:
        return BY_STATUS[status]
    return ServerError if status >= 500 else ApiError
