"""API key scopes, checked on every route before anything is looked up.

- ``full``: every route.
- ``read``: every GET (and HEAD, OPTIONS) route, nothing else: for dashboards.
- ``runner``: only the routes of the runner protocol: for runner hosts.

A view of the runner protocol says so with ``runner_route = True`` (its every method is
then open to ``runner`` and ``full`` keys, and to no other). The check runs in DRF's
``initial()``, before the handler, so a key without the scope gets 403
``insufficient_scope`` even for its own organization's run, and learns nothing about
whether an id exists.
"""

from __future__ import annotations

from typing import Any

from rest_framework.exceptions import APIException
from rest_framework.permissions import SAFE_METHODS, BasePermission
from rest_framework.request import Request

from api.authentication import ApiClient
from billing.models import ApiKeyScope


class InsufficientScope(APIException):
    status_code = 403
    default_code = "insufficient_scope"

    def __init__(self, scope: str, required: tuple[str, ...], route: str) -> None:
        # The scopes' values, as a key's `scope` is written: a member's repr
        # (`ApiKeyScope.FULL`) is Python's, not the API's.
        names = [str(getattr(name, "value", name)) for name in (scope, *required)]
        self.details = {"scope": names[0], "required": names[1:]}
        super().__init__(
            f"this API key's scope is '{names[0]}'; {route} needs a key with scope "
            f"{' or '.join(repr(name) for name in names[1:])}"
        )


def required_scopes(view: Any, method: str) -> tuple[str, ...]:
    if getattr(view, "runner_route", False):
        return (ApiKeyScope.RUNNER, ApiKeyScope.FULL)
    if getattr(view, "uploads_allowed_to_runners", False) and method not in SAFE_METHODS:
        # A runner uploads what its job produced (api/artifacts.py).
        return (ApiKeyScope.FULL, ApiKeyScope.RUNNER)
    if method in SAFE_METHODS:
        return (ApiKeyScope.FULL, ApiKeyScope.READ)
    return (ApiKeyScope.FULL,)


class ScopePermission(BasePermission):
    def has_permission(self, request: Request, view: Any) -> bool:
        client: object = request.user  # an ApiClient for API-key requests
        if not isinstance(client, ApiClient):
            return True  # not authenticated: IsAuthenticated answers 401 first
        method = (request.method or "GET").upper()
        required = required_scopes(view, method)
        scope = client.api_key.scope
        if scope not in required:
            raise InsufficientScope(scope, required, f"{method} {request.path}")
        return True
