"""Fields a client may not set (organization, status, credits, ids, timestamps) are refused
in every writable request, at the top level and inside a plan, and never applied."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from billing.models import LedgerEntry
from runs.models import HistoryEvent, Run
from tests import factories
from tests.api import states
from tests.api.routes import Route, post_routes
from tests.tenants import Tenant

pytestmark = pytest.mark.django_db

FORBIDDEN = ("organization", "status", "credits_charged", "id", "created_at")
# A route whose own body has a field of that name: a callback's `status` is how the
# operation it waited for ended (the same body as its URL's), not the run's.
OWN_FIELDS = {"run-callback": ("status",)}


def forbidden_values(other: Tenant) -> dict[str, Any]:
    return {
        "organization": str(other.organization.pk),
        "status": "completed",
        "credits_charged": "-1000",
        "id": str(uuid.uuid4()),
        "created_at": "2000-01-01T00:00:00Z",
    }


def world() -> tuple[Any, ...]:
    return (
        sorted(Run.objects.values_list("id", "organization_id", "status", "updated_at")),
        HistoryEvent.objects.count(),
        LedgerEntry.objects.count(),
    )


def valid_body(route: Route) -> dict[str, Any]:
    if route.name == "runs":
        return {"plan": factories.plan(), "start": True}
    if route.name == "run-cancel":
        return {"reason": "because"}
    if route.name in ("run-approve", "run-reject"):
        return {"comment": "fine"}
    return {}


@pytest.mark.parametrize("route", post_routes(), ids=str)
@pytest.mark.parametrize("field", FORBIDDEN)
def test_a_field_the_client_may_not_set_is_refused_and_changes_nothing(
    route: Route, field: str, tenant: Tenant, other_tenant: Tenant
) -> None:
    if field in OWN_FIELDS.get(route.name, ()):
        pytest.skip(f"{field} is a field of {route}'s own body")
    runner_body: dict[str, Any] = {}
    if route.name in states.RUNNER_ROUTES:
        values, runner_body = states.runner_request(route.name, tenant.organization)
        path = route.path(**values)
    elif route.name in states.ARTIFACT_ROUTES:
        values, runner_body = states.artifact_request(route.name, tenant.organization)
        path = route.path(**values)
    elif route.name in states.ESCALATION_ROUTES:
        values, runner_body = states.escalation_request(route.name, tenant.organization)
        path = route.path(**values)
    elif route.name in states.REUSE_ROUTES:
        values, runner_body = states.reuse_request(route.name, tenant.organization)
        path = route.path(**values)
    elif route.name in states.SCHEDULE_ROUTES:
        values, runner_body = states.schedule_request(route.name, tenant.organization)
        path = route.path(**values)
    elif route.name in states.WEBHOOK_ROUTES:
        values, runner_body = states.webhook_request(route.name, tenant.organization)
        path = route.path(**values)
    elif route.name in states.CALLBACK_ROUTES:
        values, runner_body = states.callback_request(tenant.organization)
        path = route.path(**values)
    elif route.parameters:
        ready = states.READY_FOR.get(route.name)
        assert ready is not None, f"{route}: add the state it needs to states.READY_FOR"
        path = route.path(run_id=ready(tenant.organization).pk)
    else:
        path = route.path()
    before = world()

    response = tenant.post(
        path,
        {**valid_body(route), **runner_body, field: forbidden_values(other_tenant)[field]},
    )

    assert response.status_code == 400, response.json()
    assert response.json()["code"] == "invalid_request"
    assert [problem["path"] for problem in response.json()["details"]] == [field]
    assert world() == before


@pytest.mark.parametrize("field", FORBIDDEN)
def test_a_field_the_client_may_not_set_inside_a_plan_is_refused(
    field: str, tenant: Tenant, other_tenant: Tenant
) -> None:
    plan = {**factories.plan(), field: forbidden_values(other_tenant)[field]}

    response = tenant.post("/api/v1/runs", {"plan": plan, "start": True})

    assert response.status_code == 400
    assert response.json()["code"] == "invalid_plan"
    assert response.json()["details"][0]["path"] == field
    assert not Run.objects.exists()


def test_the_stored_plan_is_exactly_what_was_sent_and_nothing_comes_from_it_but_the_plan(
    tenant: Tenant,
) -> None:
    plan = factories.plan(priority=3, variables={"status": "completed", "organization": "x"})

    body = tenant.post("/api/v1/runs", {"plan": plan}).json()

    run = Run.objects.get(pk=body["id"])
    assert run.organization_id == tenant.organization.pk
    assert (run.status, run.priority) == ("created", 3)
    assert run.plan == plan
