"""Tenant isolation, generated from the URLconf: every route that takes a run id answers
another organization 404 for every method (actions included) and changes nothing; every
route that takes a secret's name acts in the caller's organization only; every list shows
none of another organization's rows. A new route is covered automatically."""

from __future__ import annotations

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from artifacts.models import Artifact
from billing.models import LedgerEntry, Secret
from billing.secrets import decrypt_value, secret_put
from ratelimits.models import RateLimit
from runs.admission.step_admission import rate_limit_put
from runs.models import Run
from runs.selectors import run_history
from schedules.models import Schedule, ScheduleFire
from tests.api import states
from tests.api.routes import Route, api_routes, routes_with, routes_without_parameters
from tests.api.states import publish_tool
from tests.tenants import Tenant
from webhooks.models import WebhookDelivery, WebhookEndpoint

pytestmark = pytest.mark.django_db

ID_ROUTES = routes_with("run_id")
# An organization's secret, or rate limit, by name.
NAME_ROUTES = [route for route in routes_with("name") if route.name == "secret"]
RATE_LIMIT_ROUTES = [route for route in routes_with("name") if route.name == "rate-limit"]
TOOL_ROUTES = [route for route in routes_with("name") if route.name == "tool"]  # a worker tool
JOB_ROUTES = routes_with("job_id")  # an organization's runner job
ARTIFACT_ROUTES = routes_with("artifact_id")  # an organization's artifact
ESCALATION_ROUTES = routes_with("escalation_id")  # an organization's escalation ticket
SCHEDULE_ROUTES = routes_with("schedule_id")  # an organization's run schedule
WEBHOOK_ROUTES = routes_with("webhook_id")  # an organization's webhook endpoint
# The runner protocol's routes name a runner in their body or query (a poll is a GET
# but no list): tested below with another organization's runner.
RUNNER_ROUTES = [
    route for route in routes_without_parameters() if getattr(route.view, "runner_route", False)
]
LIST_ROUTES = [
    route
    for route in routes_without_parameters()
    if "get" in route.methods and route not in RUNNER_ROUTES
]


def snapshot(run: Run) -> tuple[object, ...]:
    current = Run.objects.get(pk=run.pk)
    return (
        current.status,
        current.deleted_at,
        current.updated_at,
        run_history(run).count(),
        LedgerEntry.objects.filter(run=run).count(),
    )


def test_every_api_route_is_either_scoped_by_run_id_or_a_list() -> None:
    # If this fails, a route takes a parameter the isolation tests do not know how to
    # fill: teach them (a foreign object of that kind must answer 404 too).
    known = {
        *map(str, ID_ROUTES),
        *map(str, NAME_ROUTES),
        *map(str, RATE_LIMIT_ROUTES),
        *map(str, TOOL_ROUTES),
        *map(str, JOB_ROUTES),
        *map(str, ARTIFACT_ROUTES),
        *map(str, ESCALATION_ROUTES),
        *map(str, SCHEDULE_ROUTES),
        *map(str, WEBHOOK_ROUTES),
        *map(str, routes_without_parameters()),
    }
    assert {str(route) for route in api_routes()} == known


@pytest.mark.parametrize("route", ID_ROUTES, ids=str)
def test_another_organizations_run_is_not_found_for_every_method(
    route: Route, tenant: Tenant, other_tenant: Tenant
) -> None:
    theirs = states.running(tenant.organization)
    path = route.path(run_id=theirs.pk)
    before = snapshot(theirs)

    for method in route.methods:
        response = getattr(other_tenant.client, method)(path, {}, format="json")

        assert response.status_code == 404, (method, path, response.content)
        assert response.json() == {"code": "not_found", "message": "not found", "details": None}
    assert snapshot(theirs) == before
    # The same route does serve its owner (the 404 is about the tenant, not the route).
    if "get" in route.methods:
        assert tenant.get(path).status_code == 200


def secrets_of(tenant: Tenant) -> dict[str, tuple[str, object]]:
    return {
        secret.name: (decrypt_value(secret.value_encrypted), secret.updated_at)
        for secret in Secret.objects.filter(organization=tenant.organization)
    }


@pytest.mark.parametrize("route", NAME_ROUTES, ids=str)
def test_another_organizations_secret_is_never_reached_by_name(
    route: Route, tenant: Tenant, other_tenant: Tenant
) -> None:
    secret_put(organization=tenant.organization, name="TOKEN", value="theirs")
    path = route.path(name="TOKEN")
    before = secrets_of(tenant)

    # PUT last: once it has created the caller's own TOKEN, a DELETE would find that one.
    for method in sorted(route.methods, key=lambda method: method == "put"):
        response = getattr(other_tenant.client, method)(path, {"value": "mine"}, format="json")

        if method == "put":  # creates the caller's own secret of that name
            assert response.status_code == 201, response.content
            assert secrets_of(other_tenant)["TOKEN"][0] == "mine"
        else:
            assert response.status_code == 404, (method, path, response.content)
            assert response.json() == {
                "code": "not_found",
                "message": "not found",
                "details": None,
            }
    assert secrets_of(tenant) == before


@pytest.mark.parametrize("route", RATE_LIMIT_ROUTES, ids=str)
def test_another_organizations_rate_limit_is_never_reached_by_name(
    route: Route, tenant: Tenant, other_tenant: Tenant
) -> None:
    rate_limit_put(organization=tenant.organization, name="openai", limit=5, period_ms=1000)
    path = route.path(name="openai")

    # PUT last: once it has declared the caller's own limit, a DELETE would find that one.
    for method in sorted(route.methods, key=lambda method: method == "put"):
        body = {"limit": 9, "period": "1m"} if method == "put" else None
        response = getattr(other_tenant.client, method)(path, body, format="json")

        if method == "put":  # declares the caller's own limit of that name
            assert response.status_code == 201, response.content
        else:
            assert response.status_code == 404, (method, path, response.content)
            assert response.json()["code"] == "not_found"
    theirs = RateLimit.objects.get(organization=tenant.organization, name="openai")
    assert (theirs.limit, theirs.period_ms) == (5, 1000)
    mine = RateLimit.objects.get(organization=other_tenant.organization, name="openai")
    assert (mine.limit, mine.period_ms) == (9, 60_000)


@pytest.mark.parametrize("route", TOOL_ROUTES, ids=str)
def test_another_organizations_worker_tool_is_not_found_by_name(
    route: Route, tenant: Tenant, other_tenant: Tenant
) -> None:
    publish_tool(tenant.organization, "acme.private")
    path = route.path(name="acme.private")

    response = other_tenant.get(path)

    assert response.status_code == 404, response.content
    assert response.json()["code"] == "not_found"
    assert tenant.get(path).status_code == 200


@pytest.mark.parametrize("route", ID_ROUTES, ids=str)
def test_a_run_id_that_does_not_exist_is_not_found_like_a_foreign_one(
    route: Route, tenant: Tenant
) -> None:
    path = route.path(run_id="00000000-0000-4000-8000-000000000000")
    for method in route.methods:
        response = getattr(tenant.client, method)(path, {}, format="json")
        assert response.status_code == 404, (method, path)
        assert response.json()["code"] == "not_found"


@pytest.mark.parametrize("route", LIST_ROUTES, ids=str)
def test_lists_and_totals_show_nothing_of_another_organization(
    route: Route, tenant: Tenant, other_tenant: Tenant
) -> None:
    path = route.path()
    params = {"page_size": 500} if route.accepts("get", "page_size") else {}
    states.created(other_tenant.organization)
    secret_put(organization=other_tenant.organization, name="OTHERS", value="x")
    rate_limit_put(organization=other_tenant.organization, name="others", limit=1, period_ms=1000)
    publish_tool(other_tenant.organization, "others.tool")
    before = other_tenant.get(path, params).json()

    for make in (states.running, states.created, states.failed, states.waiting_approval):
        make(tenant.organization)
    states.runner(tenant.organization)
    states.runner_job(tenant.organization)
    states.escalation(tenant.organization)
    states.schedule(tenant.organization)
    states.webhook(tenant.organization)
    secret_put(organization=tenant.organization, name="OWN", value="y")
    rate_limit_put(organization=tenant.organization, name="own", limit=1, period_ms=1000)
    publish_tool(tenant.organization, "own.tool")

    # Another organization's activity is invisible: not a row, not a total changes.
    assert other_tenant.get(path, params).json() == before
    theirs = tenant.get(path, params).json()
    assert theirs != before
    if "results" in theirs:
        assert theirs["results"], f"{route} shows its owner nothing: the test proves nothing"
        assert not {row.get("id", row.get("name")) for row in theirs["results"]} & {
            row.get("id", row.get("name")) for row in before["results"]
        }


@pytest.mark.parametrize("route", ID_ROUTES, ids=str)
def test_a_malformed_run_id_is_not_found_as_json(route: Route, tenant: Tenant) -> None:
    path = route.path(run_id="not-a-uuid")
    response = getattr(tenant.client, route.methods[0])(path)

    assert response.status_code == 404
    assert response.json()["code"] == "not_found"


@pytest.mark.parametrize("route", JOB_ROUTES, ids=str)
def test_another_organizations_runner_job_is_not_found_for_every_method(
    route: Route, tenant: Tenant, other_tenant: Tenant
) -> None:
    theirs = states.runner_job(tenant.organization, states.runner(tenant.organization))
    own_runner = states.runner(other_tenant.organization)
    path = route.path(job_id=theirs.pk)

    bodies = {
        "job-started": {"runner_id": own_runner.pk},
        "job-completed": {"runner_id": own_runner.pk, "result": None},
        "job-failed": {"runner_id": own_runner.pk, "error": "x"},
        "job-stopped": {"runner_id": own_runner.pk, "signal": "SIGTERM"},
        "job-artifacts": {
            "runner_id": own_runner.pk,
            "name": "x.txt",
            "file": SimpleUploadedFile("x.txt", b"x"),
        },
    }
    # The artifact upload is a form with a file; every other route takes JSON.
    sent_as = "multipart" if route.name == "job-artifacts" else "json"
    for method in route.methods:
        body = bodies.get(route.name, {})
        response = getattr(other_tenant.client, method)(path, body, format=sent_as)

        assert response.status_code == 404, (method, path, response.content)
        assert response.json()["code"] == "not_found"
    theirs.refresh_from_db()
    assert theirs.status == "claimed"
    assert not Artifact.objects.filter(run_id=theirs.run_id).exists()
    if "get" in route.methods:
        assert tenant.get(path).status_code == 200


@pytest.mark.parametrize("route", ARTIFACT_ROUTES, ids=str)
def test_another_organizations_artifact_is_not_found_for_every_method(
    route: Route, tenant: Tenant, other_tenant: Tenant
) -> None:
    theirs = states.artifact(tenant.organization)
    path = route.path(artifact_id=theirs.pk)

    for method in route.methods:
        response = getattr(other_tenant.client, method)(path, {}, format="json")

        assert response.status_code == 404, (method, path, response.content)
        assert response.json()["code"] == "not_found"
    theirs.refresh_from_db()
    assert theirs.status == "available"
    if "get" in route.methods:
        assert tenant.get(path).status_code in (200, 302)


@pytest.mark.parametrize("route", ESCALATION_ROUTES, ids=str)
def test_another_organizations_escalation_is_not_found_for_every_method(
    route: Route, tenant: Tenant, other_tenant: Tenant
) -> None:
    theirs = states.escalation(tenant.organization)
    path = route.path(escalation_id=theirs.pk)

    for method in route.methods:
        body = {"action": "cancel", "note": "not mine"} if route.name.endswith("resolve") else {}
        response = getattr(other_tenant.client, method)(path, body, format="json")

        assert response.status_code == 404, (method, path, response.content)
        assert response.json()["code"] == "not_found"
    theirs.refresh_from_db()
    assert (theirs.status, theirs.run.status) == ("open", "escalated")
    if "get" in route.methods:
        assert tenant.get(path).status_code == 200


@pytest.mark.parametrize("route", SCHEDULE_ROUTES, ids=str)
def test_another_organizations_schedule_is_not_found_for_every_method(
    route: Route, tenant: Tenant, other_tenant: Tenant
) -> None:
    theirs = states.schedule(tenant.organization)
    path = route.path(schedule_id=theirs.pk)
    before = Schedule.objects.values().get(pk=theirs.pk)

    for method in route.methods:
        body = states.schedule_body() if method == "patch" else {}
        response = getattr(other_tenant.client, method)(path, body, format="json")

        assert response.status_code == 404, (method, path, response.content)
        assert response.json() == {"code": "not_found", "message": "not found", "details": None}
    assert Schedule.objects.values().get(pk=theirs.pk) == before
    assert not ScheduleFire.objects.exists()
    if "get" in route.methods:
        assert tenant.get(path).status_code == 200


@pytest.mark.parametrize("route", WEBHOOK_ROUTES, ids=str)
def test_another_organizations_webhook_is_not_found_for_every_method(
    route: Route, tenant: Tenant, other_tenant: Tenant
) -> None:
    theirs = states.webhook_delivery(tenant.organization)
    values = {"webhook_id": theirs.endpoint_id, "delivery_id": theirs.uid}
    path = route.path(**{k: v for k, v in values.items() if k in route.parameters})
    before = (
        WebhookEndpoint.objects.values().get(pk=theirs.endpoint_id),
        WebhookDelivery.objects.values().get(pk=theirs.pk),
    )

    for method in route.methods:
        body = {"enabled": False} if method == "patch" else {}
        response = getattr(other_tenant.client, method)(path, body, format="json")

        assert response.status_code == 404, (method, path, response.content)
        assert response.json() == {"code": "not_found", "message": "not found", "details": None}
    after = (
        WebhookEndpoint.objects.values().get(pk=theirs.endpoint_id),
        WebhookDelivery.objects.values().get(pk=theirs.pk),
    )
    assert after == before
    assert WebhookDelivery.objects.count() == 1
    if "get" in route.methods:
        assert tenant.get(path).status_code == 200


@pytest.mark.parametrize("route", RUNNER_ROUTES, ids=str)
def test_another_organizations_runner_is_not_found_on_every_runner_route(
    route: Route, tenant: Tenant, other_tenant: Tenant
) -> None:
    theirs = states.runner(tenant.organization)
    if route.name == "runner-register":
        # The same identity in another organization is another runner: no 409.
        body = {"hostname": "host-a", "project_dir": "/srv/project", "executor_type": "claude-code"}
        response = other_tenant.post(route.path(), body)
        assert response.status_code == 201, response.json()
        assert response.json()["runner_id"] != theirs.pk
        return
    for method in route.methods:
        data = {"runner_id": theirs.pk, **({"wait": 0} if method == "get" else {})}
        if route.name == "runner-reports":
            data["reports"] = []
        response = getattr(other_tenant.client, method)(route.path(), data, format="json")

        assert response.status_code == 404, (method, response.content)
        assert response.json()["code"] == "not_found"
    theirs.refresh_from_db()
    assert theirs.deregistered_at is None
