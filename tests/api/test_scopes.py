"""API key scopes on every route, generated from the URLconf (like the isolation tests):
`read` may only GET, `runner` may only use runner routes, `full` may do everything; the
scope is checked before any object is looked up. A new route is covered automatically."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from billing.models import ApiKeyScope
from billing.secrets import secret_put
from billing.services import api_key_create
from runs.models import Run
from tests.api import states
from tests.api.routes import Route, api_routes
from tests.api.test_isolation import snapshot
from tests.tenants import Tenant

pytestmark = pytest.mark.django_db

ROUTES = api_routes()
UNKNOWN_RUN = "00000000-0000-4000-8000-000000000000"
UNKNOWN_SECRET = "NO_SUCH_SECRET"


def client_with(tenant: Tenant, scope: str) -> APIClient:
    _, key = api_key_create(organization=tenant.organization, name=scope, scope=scope)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    return client


def paths(route: Route, own: Run, foreign: Run) -> list[str]:
    if "run_id" in route.parameters:
        return [route.path(run_id=run_id) for run_id in (own.pk, foreign.pk, UNKNOWN_RUN)]
    if "name" in route.parameters:  # a secret: each organization has one of this name
        for run in (own, foreign):
            secret_put(organization=run.organization, name="TOKEN", value="v")
        return [route.path(name=name) for name in ("TOKEN", UNKNOWN_SECRET)]
    if "job_id" in route.parameters:  # a runner job of each organization, and none
        jobs = [states.runner_job(run.organization).pk for run in (own, foreign)]
        return [route.path(job_id=job_id) for job_id in (*jobs, UNKNOWN_RUN)]
    if "artifact_id" in route.parameters:  # an artifact of each organization, and none
        artifacts = [states.artifact(run.organization).pk for run in (own, foreign)]
        return [route.path(artifact_id=pk) for pk in (*artifacts, UNKNOWN_RUN)]
    if "escalation_id" in route.parameters:  # a ticket of each organization, and none
        tickets = [states.escalation(run.organization).pk for run in (own, foreign)]
        return [route.path(escalation_id=pk) for pk in (*tickets, UNKNOWN_RUN)]
    if "schedule_id" in route.parameters:  # a schedule of each organization, and none
        schedules = [states.schedule(run.organization).pk for run in (own, foreign)]
        return [route.path(schedule_id=pk) for pk in (*schedules, UNKNOWN_RUN)]
    if "delivery_id" in route.parameters:  # a delivery of each organization, and none
        deliveries = [states.webhook_delivery(run.organization) for run in (own, foreign)]
        return [route.path(webhook_id=d.endpoint_id, delivery_id=d.uid) for d in deliveries] + [
            route.path(webhook_id=UNKNOWN_RUN, delivery_id=UNKNOWN_RUN)
        ]
    if "webhook_id" in route.parameters:  # an endpoint of each organization, and none
        hooks = [states.webhook(run.organization).pk for run in (own, foreign)]
        return [route.path(webhook_id=pk) for pk in (*hooks, UNKNOWN_RUN)]
    return [route.path()]


def call(client: APIClient, method: str, path: str) -> Any:
    return getattr(client, method)(path, {}, format="json")


def assert_insufficient(response: Any, scope: str) -> None:
    assert response.status_code == 403, response.content
    body = response.json()
    assert body["code"] == "insufficient_scope"
    assert body["details"]["scope"] == scope
    assert scope in body["message"]


@pytest.mark.parametrize("route", ROUTES, ids=str)
def test_a_read_key_may_get_and_nothing_else(
    route: Route, tenant: Tenant, other_tenant: Tenant
) -> None:
    own, foreign = states.running(tenant.organization), states.running(other_tenant.organization)
    before = snapshot(own), snapshot(foreign)
    reader = client_with(tenant, ApiKeyScope.READ)
    # A runner's poll claims jobs: a GET that is no read, for runner and full keys only.
    runner_route = getattr(route.view, "runner_route", False)
    # Runners upload artifacts with their key: those writes take runner or full keys.
    uploads = getattr(route.view, "uploads_allowed_to_runners", False)

    for path in paths(route, own, foreign):
        for method in route.methods:
            response = call(reader, method, path)
            if runner_route:
                assert_insufficient(response, "read")
                assert response.json()["details"]["required"] == ["runner", "full"]
            elif method == "get":
                assert response.status_code != 403, (path, response.content)
            else:
                assert_insufficient(response, "read")
                required = ["full", "runner"] if uploads else ["full"]
                assert response.json()["details"]["required"] == required

    assert (snapshot(own), snapshot(foreign)) == before


@pytest.mark.parametrize("route", ROUTES, ids=str)
def test_a_runner_key_may_use_only_runner_routes(
    route: Route, tenant: Tenant, other_tenant: Tenant
) -> None:
    own, foreign = states.running(tenant.organization), states.running(other_tenant.organization)
    before = snapshot(own)
    runner = client_with(tenant, ApiKeyScope.RUNNER)
    runner_route = getattr(route.view, "runner_route", False)
    uploads = getattr(route.view, "uploads_allowed_to_runners", False)

    for path in paths(route, own, foreign):
        for method in route.methods:
            response = call(runner, method, path)
            if runner_route or (uploads and method != "get"):
                assert response.status_code != 403, (path, response.content)
            else:
                assert_insufficient(response, "runner")

    assert snapshot(own) == before


@pytest.mark.parametrize("route", ROUTES, ids=str)
def test_a_full_key_is_never_refused_for_its_scope(
    route: Route, tenant: Tenant, other_tenant: Tenant
) -> None:
    own, foreign = states.running(tenant.organization), states.running(other_tenant.organization)
    full = client_with(tenant, ApiKeyScope.FULL)

    for path in paths(route, own, foreign):
        for method in route.methods:
            response = call(full, method, path)
            assert response.status_code != 403, (method, path, response.content)


def test_without_a_key_it_is_still_401_not_403(tenant: Tenant) -> None:
    response = APIClient().post("/api/v1/runs", {}, format="json")

    assert response.status_code == 401


def test_an_unknown_scope_is_refused_by_the_service(tenant: Tenant) -> None:
    with pytest.raises(ValueError, match="unknown scope"):
        api_key_create(organization=tenant.organization, scope="admin")


def test_a_refused_scope_is_named_by_its_value_not_a_python_repr(tenant: Tenant) -> None:
    """A read key's POST was told `needs a key with scope ApiKeyScope.FULL`."""
    response = call(client_with(tenant, ApiKeyScope.READ), "post", "/api/v1/runs")

    assert response.status_code == 403
    body = response.json()
    assert body["message"] == (
        "this API key's scope is 'read'; POST /api/v1/runs needs a key with scope 'full'"
    )
    assert body["details"] == {"scope": "read", "required": ["full"]}
