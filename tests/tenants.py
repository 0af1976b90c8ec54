"""Tenants for API tests: an organization with credits, its API key and a client using it
(the fixtures `tenant`, `other_tenant` and `new_tenant` are tests/conftest.py's), and the
shape every API error answers with."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx
from rest_framework.test import APIClient

from billing.models import Organization
from billing.services import api_key_create
from tests import factories


@dataclass
class Tenant:
    organization: Organization
    key: str
    client: APIClient

    def post(self, path: str, body: Any = None, **headers: str) -> Any:
        return self.client.post(path, body, format="json", headers=headers or None)

    def get(self, path: str, params: Any = None) -> Any:
        return self.client.get(path, params)


@dataclass(frozen=True)
class LiveTenant:
    """A tenant of pytest-django's live server (a real HTTP server in a thread): its URL,
    its key and its organization (the fixture ``live``)."""

    url: str
    key: str
    organization: Organization

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}

    def call(self, method: str, path: str, body: Any = None) -> httpx.Response:
        """``method`` /api/v1/``path`` with this tenant's key."""
        return httpx.request(
            method, f"{self.url}/api/v1/{path}", json=body, headers=self.auth, timeout=10
        )


def make_tenant(credits: int | str = 1000) -> Tenant:
    organization = factories.org(credits=credits)
    _, key = api_key_create(organization=organization)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    return Tenant(organization, key, client)


def assert_error(response: Any, status: int, code: str) -> dict[str, Any]:
    """``response`` is an API error of ``status`` and ``code``: JSON with a code, a message
    and details (api/errors.py); returns its body."""
    assert response.status_code == status, response.content
    assert response["Content-Type"] == "application/json"
    body: dict[str, Any] = response.json()
    assert set(body) == {"code", "message", "details"}
    assert body["code"] == code
    assert body["message"]
    return body
