"""Query parameters of every list, generated from the URLconf: an unknown parameter or an
empty value is a 400 naming it, before anything is looked up, whatever the list."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from django.core.exceptions import ValidationError

from common.filters import QueryInvalid
from runs import selectors
from tests.api import states
from tests.api.routes import Route, api_routes
from tests.tenants import Tenant

pytestmark = pytest.mark.django_db

GET_LISTS = [
    route
    for route in api_routes()
    if route.accepts("get", "page_size") or getattr(route.view, "filterset", None)
]
NO_SUCH_RUN = uuid.UUID("00000000-0000-4000-8000-000000000000")


def test_every_list_is_found() -> None:
    names = {route.name for route in GET_LISTS}
    assert {"runs", "run-events", "run-steps", "billing-ledger", "secrets"} <= names, names


@pytest.mark.parametrize("route", GET_LISTS, ids=str)
def test_every_list_refuses_an_unknown_parameter_even_for_a_run_that_does_not_exist(
    route: Route, tenant: Tenant
) -> None:
    # Every id in the path (a run's, a schedule's) of something that does not exist.
    path = route.path(**dict.fromkeys(route.parameters, NO_SUCH_RUN))

    response = tenant.get(path, {"stauts": "failed"})

    assert response.status_code == 400
    assert response.json()["code"] == "invalid_request"
    assert response.json()["details"] == [
        {"path": "stauts", "message": "unknown query parameter", "code": "invalid"}
    ]


@pytest.mark.parametrize(
    ("child", "parameter"),
    [
        ("", "priority"),
        ("", "status"),
        ("", "ordering"),
        ("", "created_before"),
        ("/agents", "attempt"),
        ("/tasks", "agent"),
        ("/steps", "task"),
        ("/steps", "status"),
        ("/events", "kind"),
        ("/events", "after"),
        ("/events", "cursor"),
        ("/events", "page_size"),
    ],
)
def test_an_empty_value_is_malformed_not_omitted(
    tenant: Tenant, child: str, parameter: str
) -> None:
    path = f"/api/v1/runs/{states.running(tenant.organization).pk}{child}" if child else ""

    response = tenant.get(path or "/api/v1/runs", {parameter: ""})

    assert response.status_code == 400
    assert response.json()["code"] == "invalid_request"
    assert [problem["path"] for problem in response.json()["details"]] == [parameter]


@pytest.mark.parametrize("parameter", ["type", "run"])
def test_the_ledger_refuses_an_empty_or_malformed_filter(tenant: Tenant, parameter: str) -> None:
    empty = tenant.get("/api/v1/billing/ledger", {parameter: ""})
    malformed = tenant.get("/api/v1/billing/ledger", {parameter: "nonsense"})

    assert empty.status_code == malformed.status_code == 400
    assert malformed.json()["details"][0]["path"] == parameter


def test_page_and_filter_problems_are_reported_together(tenant: Tenant) -> None:
    response = tenant.get("/api/v1/runs", {"page": "0", "priority": "10", "status": "sleeping"})

    body = response.json()
    assert response.status_code == 400
    assert [problem["path"] for problem in body["details"]] == ["page", "status", "priority"]
    assert body["message"].startswith("invalid request: page: ")


def test_a_date_time_offset_postgresql_cannot_store_still_filters(tenant: Tenant) -> None:
    run = states.created(tenant.organization)

    response = tenant.get("/api/v1/runs", {"created_after": "2000-01-01T00:00:00-21:19"})

    assert response.status_code == 200, response.json()
    assert [row["id"] for row in response.json()["results"]] == [str(run.pk)]


def test_the_ledger_filters_by_type_and_run(tenant: Tenant) -> None:
    run = states.failed(tenant.organization)
    states.failed(tenant.organization)

    def types(**params: Any) -> list[str]:
        response = tenant.get("/api/v1/billing/ledger", params)
        assert response.status_code == 200, response.json()
        return [entry["type"] for entry in response.json()["results"]]

    assert types(run=str(run.pk)) == ["refund", "reserve"]
    assert types(type="reserve") == ["reserve", "reserve"]
    assert types(type="grant", run=str(run.pk)) == []


def test_a_query_a_selector_refuses_is_a_400_naming_the_parameter(
    tenant: Tenant, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Selectors check their query themselves, for callers other than the API.
    def refusing(**kwargs: Any) -> Any:
        raise QueryInvalid({"status": [ValidationError("not now", code="invalid_choice")]})

    monkeypatch.setattr(selectors, "run_list", refusing)

    response = tenant.get("/api/v1/runs")

    assert response.status_code == 400
    assert response.json() == {
        "code": "invalid_request",
        "message": "invalid request: status: not now",
        "details": [{"path": "status", "message": "not now", "code": "invalid_choice"}],
    }
