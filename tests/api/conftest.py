"""Tenants for API tests: an organization with credits, its API key and a client using it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
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


def make_tenant(credits: int | str = 1000) -> Tenant:
    organization = factories.org(credits=credits)
    _, key = api_key_create(organization=organization)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    return Tenant(organization, key, client)


@pytest.fixture
def tenant(db: None) -> Tenant:
    return make_tenant()


@pytest.fixture
def other_tenant(db: None) -> Tenant:
    return make_tenant()


@pytest.fixture
def new_tenant(db: None) -> Callable[..., Tenant]:
    return make_tenant
