"""API keys: a hashed key of an organization opens its API; anything else is 401."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from billing.models import ApiKey
from billing.services import api_key_revoke
from tests.api.routes import api_routes
from tests.tenants import Tenant

pytestmark = pytest.mark.django_db

RUNS = "/api/v1/runs"


def status_with(authorization: str | None) -> tuple[int, dict[str, object], str | None]:
    client = APIClient()
    if authorization is not None:
        client.credentials(HTTP_AUTHORIZATION=authorization)
    response = client.get(RUNS)
    return response.status_code, response.json(), response.headers.get("WWW-Authenticate")


def test_a_valid_key_is_let_in(tenant: Tenant) -> None:
    assert status_with(f"Bearer {tenant.key}")[0] == 200


def test_a_request_without_a_key_is_401_with_a_bearer_challenge() -> None:
    status, body, challenge = status_with(None)

    assert status == 401
    assert body["code"] == "not_authenticated"
    assert challenge == 'Bearer realm="api"'


@pytest.mark.parametrize(
    "authorization",
    [
        "Bearer",
        "Bearer ",
        "Basic dXNlcjpwYXNz",
        "Token ork_abc_def",
        "Bearer ork_abc_def extra",
        "Bearer not-a-key",
        "Bearer ork_deadbeef_" + "x" * 43,
        "Bearer " + "ork_" * 100,
    ],
)
def test_unknown_or_malformed_keys_are_401(authorization: str) -> None:
    status, body, _ = status_with(authorization)

    assert status == 401
    assert body["code"] in {"authentication_failed", "not_authenticated"}


def test_a_revoked_key_is_401(tenant: Tenant) -> None:
    api_key_revoke(api_key=ApiKey.objects.get(organization=tenant.organization))

    status, body, _ = status_with(f"Bearer {tenant.key}")

    assert status == 401
    assert body == {
        "code": "authentication_failed",
        "message": "unknown or revoked API key",
        "details": None,
    }


def test_the_key_is_stored_only_as_a_digest(tenant: Tenant) -> None:
    api_key = ApiKey.objects.get(organization=tenant.organization)

    assert tenant.key not in {api_key.key_hash, api_key.prefix}
    assert len(api_key.key_hash) == 64


def test_every_api_route_requires_a_key(tenant: Tenant) -> None:
    for route in api_routes():
        path = route.path(
            run_id="00000000-0000-4000-8000-000000000000",
            name="TOKEN",
            job_id="00000000-0000-4000-8000-000000000000",
            artifact_id="00000000-0000-4000-8000-000000000000",
            escalation_id="00000000-0000-4000-8000-000000000000",
            schedule_id="00000000-0000-4000-8000-000000000000",
            webhook_id="00000000-0000-4000-8000-000000000000",
            delivery_id="00000000-0000-4000-8000-000000000000",
        )
        for method in route.methods:
            response = getattr(APIClient(), method)(path, {}, format="json")
            assert response.status_code == 401, (method, path)


def test_only_the_index_and_callback_urls_take_no_key() -> None:
    assert [route.name for route in api_routes(public=True)] == ["index", "callback"]
    unknown = APIClient().post("/api/v1/callbacks/nope", {"status": "completed"}, format="json")
    assert unknown.status_code == 404
    assert unknown.json()["code"] == "not_found"


def test_the_schema_and_its_docs_are_public() -> None:
    schema = APIClient().get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    docs = APIClient().get("/api/docs/")

    assert schema.status_code == 200
    assert schema.json()["components"]["securitySchemes"]["ApiKeyAuth"]["scheme"] == "bearer"
    assert docs.status_code == 200
    assert b"swagger" in docs.content.lower()
