"""`Authorization: Bearer <api key>`: the key's organization scopes every query, and a
suspended organization's keys are refused (403 `organization_suspended`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.exceptions import APIException, AuthenticationFailed
from rest_framework.request import Request

from billing.models import ApiKey, Organization
from billing.services import api_key_authenticate

KEYWORD = "Bearer"


@dataclass(frozen=True)
class ApiClient:
    """``request.user`` for a request authenticated by an API key (not a Django user)."""

    api_key: ApiKey
    is_authenticated = True
    is_anonymous = False
    is_active = True
    is_staff = False

    @property
    def organization(self) -> Organization:
        return self.api_key.organization

    @property
    def pk(self) -> Any:
        return self.api_key.pk

    def get_username(self) -> str:
        return self.actor

    @property
    def actor(self) -> str:
        """How services and RunEvents name this client."""
        return f"api:{self.api_key.prefix}"

    def __str__(self) -> str:
        return self.actor


class OrganizationSuspended(APIException):
    """The key is valid, its organization suspended by an operator (docs/tenants.md)."""

    status_code = 403
    default_code = "organization_suspended"
    default_detail = "this organization is suspended; ask the operators of this service"


class ApiKeyAuthentication(BaseAuthentication):
    """Unknown, malformed and revoked keys are refused (401); no header: not authenticated.
    A key of a suspended organization is refused with 403 ``organization_suspended``: the
    organization's row comes with the key's (one query, as before), so the check costs
    nothing more. Raised here, as an APIException, the request is then anonymous for
    whatever reads ``request.user`` after (metrics, throttling)."""

    def authenticate(self, request: Request) -> tuple[ApiClient, ApiKey] | None:
        header = get_authorization_header(request)
        if not header:
            return None
        try:
            parts = header.decode("ascii").split()
        except UnicodeDecodeError as exc:
            raise AuthenticationFailed("the Authorization header is not ASCII") from exc
        if len(parts) != 2 or parts[0].lower() != KEYWORD.lower():
            raise AuthenticationFailed("expected 'Authorization: Bearer <api key>'")
        api_key = api_key_authenticate(parts[1])
        if api_key is None:
            raise AuthenticationFailed("unknown or revoked API key")
        if api_key.organization.suspended_at is not None:
            raise OrganizationSuspended
        return ApiClient(api_key), api_key

    def authenticate_header(self, request: Request) -> str:
        # Present, so that DRF answers 401 (with WWW-Authenticate) rather than 403.
        return f'{KEYWORD} realm="api"'


def client_of(request: Request) -> ApiClient:
    """The authenticated client; views run only after IsAuthenticated let them in."""
    user: object = request.user
    if not isinstance(user, ApiClient):
        raise AuthenticationFailed("an API key is required")
    return user


def organization_of(request: Request) -> Organization:
    return client_of(request).organization


class ApiKeyAuthenticationScheme(OpenApiAuthenticationExtension):  # type: ignore[no-untyped-call]
    """The OpenAPI security scheme of ``ApiKeyAuthentication``."""

    target_class = ApiKeyAuthentication
    name = "ApiKeyAuth"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "An API key of your organization: `Authorization: Bearer ork_...`.",
        }
