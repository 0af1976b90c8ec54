"""A create without a start answers the run from the row it wrote (no re-read): the
answer must be exactly what GET /runs/{id} says of the same run."""

from __future__ import annotations

from typing import Any

import pytest

from tests import factories
from tests.api.test_yaml_plans import PLAN, post_yaml
from tests.tenants import Tenant

pytestmark = pytest.mark.django_db


def read(tenant: Tenant, run_id: str) -> dict[str, Any]:
    response = tenant.get(f"/api/v1/runs/{run_id}")
    assert response.status_code == 200
    body: dict[str, Any] = response.json()
    return body


@pytest.mark.parametrize(
    "plan",
    [
        factories.plan(),
        {
            **factories.plan(name="keyed", agents=2, tasks=2, steps=3),
            "variables": {"customer": "acme", "n": 3},
            "concurrency": {"key": "customer-${variables.customer}", "max_runs": 2},
            "priority": 7,
            "max_attempts": 2,
        },
    ],
    ids=["small", "with-variables-and-a-concurrency-key"],
)
def test_a_created_run_is_answered_as_it_reads(tenant: Tenant, plan: dict[str, Any]) -> None:
    response = tenant.post("/api/v1/runs", {"plan": plan})

    assert response.status_code == 201, response.json()
    created = response.json()
    assert created["status"] == "created"
    assert created == read(tenant, created["id"])


def test_a_yaml_plan_created_without_start_is_answered_as_it_reads(tenant: Tenant) -> None:
    response = post_yaml(tenant, PLAN.replace("start: true", "start: false"))

    assert response.status_code == 201, response.json()
    assert response.json() == read(tenant, response.json()["id"])
