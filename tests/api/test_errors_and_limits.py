"""Errors are JSON with stable codes; bodies, plans, pages and request rates are bounded."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.db import InterfaceError, OperationalError

from api.parsers import BoundedJSONParser, PayloadTooLarge
from runs import selectors
from runs.models import Run
from tests import factories
from tests.api import states
from tests.tenants import Tenant, assert_error, make_tenant

pytestmark = pytest.mark.django_db

RUNS = "/api/v1/runs"


def raw_post(tenant: Tenant, body: bytes | str, content_type: str = "application/json") -> Any:
    return tenant.client.post(RUNS, body, content_type=content_type)


# --------------------------------------------------------------------------- sizes
def test_a_body_over_the_limit_is_413_before_it_is_read(tenant: Tenant, settings: Any) -> None:
    settings.API_MAX_BODY_BYTES = 1000

    response = raw_post(tenant, json.dumps({"plan": factories.plan(name="x" * 2000)}))

    assert_error(response, 413, "payload_too_large")
    assert not Run.objects.exists()


def test_the_parser_stops_reading_at_the_limit_whatever_content_length_said(
    settings: Any,
) -> None:
    settings.API_MAX_BODY_BYTES = 1000

    class Stream:
        def read(self, size: int = -1) -> bytes:
            return b" " * (size if size > 0 else 10_000)

    with pytest.raises(PayloadTooLarge):
        BoundedJSONParser().parse(Stream())  # type: ignore[arg-type]


def test_a_plan_over_the_plan_limit_is_413(tenant: Tenant, settings: Any) -> None:
    settings.ORCHESTRATOR_PLAN_LIMITS = {
        **settings.ORCHESTRATOR_PLAN_LIMITS,
        "max_spec_bytes": 2000,
    }
    plan = factories.plan(steps=100)

    response = tenant.post(RUNS, {"plan": plan})

    body = assert_error(response, 413, "payload_too_large")
    assert "plan" in body["message"]


def test_a_plan_nested_too_deep_is_an_invalid_plan_not_a_crash(
    tenant: Tenant, settings: Any
) -> None:
    deep: Any = "leaf"
    for _ in range(settings.ORCHESTRATOR_PLAN_LIMITS["max_json_depth"]):
        deep = {"x": deep}
    plan = factories.plan()
    plan["variables"] = deep

    assert_error(tenant.post(RUNS, {"plan": plan}), 400, "invalid_plan")


@pytest.mark.parametrize(
    "body",
    [
        "{",
        "[" * 100_000 + "]" * 100_000,
        '{"plan": {"name": NaN}}',
        '{"plan": {"name": Infinity}}',
        '{"plan": {"credits": 1e999}}',
        '{"plan": {"name": "a\\u0000b"}}',
        '{"plan": {"variables": {"\\u0000": 1}}}',
        '{"plan": {"name": "\\ud800"}}',
        '{"plan": {"credits": ' + "1" * 5000 + "}}",
        b'{"plan": "\xff"}',
    ],
    ids=[
        "truncated",
        "deeply nested",
        "NaN",
        "Infinity",
        "overflowing float",
        "NUL in a value",
        "NUL in a key",
        "unpaired surrogate",
        "5000-digit integer",
        "not UTF-8",
    ],
)
def test_json_that_postgresql_could_not_store_is_400_invalid_json(
    tenant: Tenant, body: str | bytes
) -> None:
    assert_error(raw_post(tenant, body), 400, "invalid_json")
    assert not Run.objects.exists()


def test_another_content_type_is_415(tenant: Tenant) -> None:
    assert_error(raw_post(tenant, "plan=x", "application/x-www-form-urlencoded"), 415,
                 "unsupported_media_type")  # fmt: skip


# --------------------------------------------------------------------------- throttling
def test_requests_beyond_the_keys_rate_are_429_with_retry_after(settings: Any) -> None:
    settings.API_THROTTLE_RATE = "3/min"
    tenant, neighbour = make_tenant(), make_tenant()

    statuses = [tenant.get(RUNS).status_code for _ in range(3)]
    throttled = tenant.get(RUNS)

    assert statuses == [200, 200, 200]
    body = assert_error(throttled, 429, "throttled")
    assert 1 <= int(throttled["Retry-After"]) <= 20
    assert body["details"] == {"retry_after": int(throttled["Retry-After"])}
    assert neighbour.get(RUNS).status_code == 200  # per key, not global


def test_throttling_lets_requests_through_when_redis_is_unreachable(settings: Any) -> None:
    settings.CELERY_BROKER_URL = "redis://127.0.0.1:1/0"
    settings.API_THROTTLE_RATE = "1/min"
    tenant = make_tenant()

    assert [tenant.get(RUNS).status_code for _ in range(3)] == [200, 200, 200]


# --------------------------------------------------------------------------- other errors
def test_an_unknown_api_route_is_a_json_404(tenant: Tenant) -> None:
    assert_error(tenant.get("/api/v1/nothing-here"), 404, "not_found")


def test_a_method_a_route_does_not_have_is_405(tenant: Tenant) -> None:
    assert_error(tenant.client.put(RUNS, {}, format="json"), 405, "method_not_allowed")


def test_an_unexpected_error_is_a_json_500_and_logged(
    tenant: Tenant, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(**kwargs: Any) -> Any:
        raise RuntimeError("database on fire")

    monkeypatch.setattr(selectors, "run_list", broken)

    body = assert_error(tenant.get(RUNS), 500, "internal_error")

    assert "fire" not in body["message"]
    assert "database on fire" in caplog.text


@pytest.mark.parametrize("error", [OperationalError, InterfaceError])
def test_a_database_outage_is_503_with_retry_after_not_a_500(
    error: type[Exception], tenant: Tenant, monkeypatch: pytest.MonkeyPatch
) -> None:
    def unreachable(**kwargs: Any) -> Any:
        raise error("connection to server at 127.0.0.1 failed: Connection refused")

    monkeypatch.setattr(selectors, "run_list", unreachable)

    response = tenant.get(RUNS)

    assert_error(response, 503, "service_unavailable")
    assert response.headers["Retry-After"] == "1"


def test_unknown_fields_in_a_body_are_refused_not_ignored(tenant: Tenant) -> None:
    run = states.running(tenant.organization)

    response = tenant.post(f"{RUNS}/{run.pk}/cancel", {"reason": "x", "reasn": "typo"})

    body = assert_error(response, 400, "invalid_request")
    assert body["details"] == [
        {"path": "reasn", "message": "unknown field; it cannot be set here", "code": "invalid"}
    ]
    assert Run.objects.get(pk=run.pk).status == "running"


def test_a_body_that_is_not_an_object_is_400(tenant: Tenant) -> None:
    assert_error(tenant.post(RUNS, ["plan"]), 400, "invalid_request")


def test_the_admin_still_gets_djangos_own_404_page(client: Any) -> None:
    response = client.get("/not-the-api")

    assert response.status_code == 404
    assert "application/json" not in response["Content-Type"]


def test_a_client_that_accepts_no_json_is_406_in_json(tenant: Tenant) -> None:
    response = tenant.client.get(RUNS, HTTP_ACCEPT="text/html")

    assert_error(response, 406, "not_acceptable")


@pytest.mark.parametrize("space", [" ", "\u00a0"])
def test_a_text_field_counts_its_length_as_sent_even_when_all_blank(
    tenant: Tenant, space: str
) -> None:
    run = states.running(tenant.organization)

    too_long = tenant.post(f"{RUNS}/{run.pk}/cancel", {"reason": space * 1001})
    assert_error(too_long, 400, "invalid_request")
    assert Run.objects.get(pk=run.pk).status == "running"
    blank = tenant.post(f"{RUNS}/{run.pk}/cancel", {"reason": space * 1000})
    assert blank.status_code == 200, blank.json()
