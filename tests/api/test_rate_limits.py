"""Rate limits through the API: declared with PUT (201, then 200), listed, shown,
deleted; bad input is a 400 with the field; another organization's is 404; a plan naming
an unknown limit, or units that can never fit, is refused with the step's path."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from billing.services import api_key_create
from ratelimits.models import RateLimit
from tests import factories
from tests.tenants import Tenant

pytestmark = pytest.mark.django_db


def put(tenant: Tenant, name: str, body: Any) -> Any:
    return tenant.client.put(f"/api/v1/rate-limits/{name}", body, format="json")


def test_a_limit_is_declared_changed_listed_shown_and_deleted(tenant: Tenant) -> None:
    created = put(tenant, "openai", {"limit": 500, "period": "1m"})
    assert created.status_code == 201, created.json()
    assert created.json() | {"created_at": None, "updated_at": None} == {
        "name": "openai",
        "limit": 500,
        "period": "1m",
        "period_ms": 60_000,
        "created_at": None,
        "updated_at": None,
    }
    changed = put(tenant, "openai", {"limit": 50, "period": "5s"})
    assert changed.status_code == 200
    assert (changed.json()["limit"], changed.json()["period_ms"]) == (50, 5000)

    listed = tenant.get("/api/v1/rate-limits").json()
    assert [row["name"] for row in listed["results"]] == ["openai"]
    assert tenant.get("/api/v1/rate-limits/openai").json()["limit"] == 50

    assert tenant.client.delete("/api/v1/rate-limits/openai").status_code == 204
    assert tenant.get("/api/v1/rate-limits/openai").status_code == 404
    assert tenant.client.delete("/api/v1/rate-limits/openai").status_code == 404


@pytest.mark.parametrize(
    ("name", "body", "field"),
    [
        ("openai", {"limit": 0, "period": "1m"}, "limit"),
        ("openai", {"limit": "5", "period": "1m"}, "limit"),
        ("openai", {"limit": 5, "period": "2d"}, "period"),
        ("openai", {"limit": 5, "period": "soon"}, "period"),
        ("openai", {"limit": 5}, "period"),
        ("bad name", {"limit": 5, "period": "1s"}, "name"),
        ("x" * 65, {"limit": 5, "period": "1s"}, "name"),
    ],
)
def test_bad_input_is_a_400_naming_the_field_and_stores_nothing(
    tenant: Tenant, name: str, body: dict[str, Any], field: str
) -> None:
    answer = put(tenant, name, body)
    assert answer.status_code == 400, answer.json()
    assert answer.json()["code"] == "invalid_request"
    assert field in {problem["path"] for problem in answer.json()["details"]}, answer.json()
    assert not RateLimit.objects.exists()


def test_another_organizations_limit_is_404(tenant: Tenant, other_tenant: Tenant) -> None:
    assert put(other_tenant, "openai", {"limit": 5, "period": "1s"}).status_code == 201
    assert tenant.get("/api/v1/rate-limits/openai").status_code == 404
    assert tenant.client.delete("/api/v1/rate-limits/openai").status_code == 404
    assert tenant.get("/api/v1/rate-limits").json()["results"] == []
    # Its own of the same name is another limit.
    assert put(tenant, "openai", {"limit": 9, "period": "1s"}).status_code == 201
    assert other_tenant.get("/api/v1/rate-limits/openai").json()["limit"] == 5


def test_a_plan_naming_an_unknown_limit_or_units_that_never_fit_is_invalid(
    tenant: Tenant,
) -> None:
    assert put(tenant, "openai", {"limit": 10, "period": "1s"}).status_code == 201
    plan = factories.plan(steps=0) | {
        "agents": [
            {
                "name": "a",
                "tasks": [
                    {
                        "name": "t",
                        "steps": [
                            factories.step("ok", rate_limits=[{"name": "openai", "units": 10}]),
                            factories.step("big", rate_limits=[{"name": "openai", "units": 11}]),
                            factories.step("typo", rate_limits=[{"name": "opneai"}]),
                            factories.step(
                                "templated",
                                rate_limits=[{"name": "openai", "units": "${variables.n}"}],
                            ),
                        ],
                    }
                ],
            }
        ],
        "variables": {"n": 3},
    }
    answer = tenant.post("/api/v1/runs", {"plan": plan})
    assert answer.status_code == 400, answer.json()
    assert answer.json()["code"] == "invalid_plan"
    paths = {error["path"]: error["message"] for error in answer.json()["details"]}
    assert set(paths) == {
        "agents[0].tasks[0].steps[1].rate_limits[0].units",
        "agents[0].tasks[0].steps[2].rate_limits[0].name",
    }
    assert "never fit" in paths["agents[0].tasks[0].steps[1].rate_limits[0].units"]
    assert "unknown rate limit 'opneai'" in paths["agents[0].tasks[0].steps[2].rate_limits[0].name"]
    assert not tenant.get("/api/v1/runs").json()["results"]


def test_a_read_key_lists_but_cannot_declare(tenant: Tenant) -> None:
    _, key = api_key_create(organization=tenant.organization, name="reader", scope="read")
    reader = APIClient()
    reader.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    assert reader.get("/api/v1/rate-limits").status_code == 200
    refused = reader.put("/api/v1/rate-limits/openai", {"limit": 1, "period": "1s"}, format="json")
    assert refused.status_code == 403
    assert refused.json()["code"] == "insufficient_scope"
