"""The OpenAPI schema against the running code: schemathesis generates requests for every
operation (valid and invalid data) and checks every response against the schema."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from hypothesis import HealthCheck, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.config import SchemathesisConfig
from schemathesis.core.parameters import ParameterLocation
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from config.wsgi import application
from runs.models import Run
from schedules import services as schedule_services
from schedules.models import Schedule
from tests.api import states
from tests.tenants import Tenant, make_tenant
from webhooks.models import WebhookDelivery

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    negative_data_rejection,
]


# Generating plans (deeply nested, free-form parameters) costs far more than any other
# body, so the operations whose body holds one (creating runs, creating and changing
# schedules) get fewer examples than the rest; both stay deterministic. The coverage
# phase (every boundary of every keyword, ~2,800 requests for a body with a plan, over a
# minute) runs once for the `Plan` component, with `POST /runs`: the schedules' bodies
# hold the same component, validated by the same `parse_plan`; their other fields'
# boundaries are tested one by one in tests/schedules/test_api.py.
PLAN_BODIES = ["runs_create", "schedules_create", "schedules_update"]
# A plan past its size limit is refused with 413 before its shape is read: the coverage
# phase's plan with one step more than `maxItems` allows is over a megabyte, and its 413
# is as much a refusal of negative data as a 400.
REJECTED = [400, 401, 403, 404, 405, 406, 409, 413, 415, 422, 428, 429, "5xx"]
CONFIG = SchemathesisConfig.from_dict(
    {
        "operations": [
            {
                "include-operation-id": ["schedules_create", "schedules_update"],
                "phases": {"coverage": {"enabled": False}},
            },
            {
                "include-operation-id": ["runs_create"],
                "checks": {"negative_data_rejection": {"expected-statuses": REJECTED}},
            },
        ]
    }
)

# Loaded when the module is collected: generating the schema reads no database.
schema = schemathesis.openapi.from_wsgi("/api/schema/", application, config=CONFIG)


@pytest.fixture(autouse=True)
def _keep_the_test_connection() -> Iterator[None]:
    # As Django's test client does: a request through the real WSGI handler must not
    # close the database connection that holds the test's transaction.
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    try:
        yield
    finally:
        request_started.connect(close_old_connections)
        request_finished.connect(close_old_connections)


@pytest.fixture
def rich_tenant(db: None, settings: Any) -> tuple[Tenant, list[Run], list[Schedule]]:
    """A tenant with plenty of credits, runs in several states and schedules (active and
    paused) to act on."""
    settings.API_THROTTLE_RATE = "100000/min"
    tenant = make_tenant(credits=10**9)
    runs = [
        make(tenant.organization)
        for make in (
            states.created,
            states.running,
            states.paused,
            states.failed,
            states.waiting_approval,
        )
    ]
    schedules = [states.schedule(tenant.organization) for _ in range(2)]
    schedule_services.schedule_pause(schedule_id=schedules[1].pk)
    for _ in range(2):  # webhook endpoints with a delivery each (_with_real_ids finds them)
        states.webhook_delivery(tenant.organization)
    return tenant, runs, schedules


def _with_real_ids(case: Any, runs: list[Run], schedules: list[Schedule]) -> None:
    """Point most generated run and schedule ids at real ones, so actions do more than
    404."""
    for name, rows in (("run_id", runs), ("schedule_id", schedules)):
        value = (case.path_parameters or {}).get(name)
        if value is None:
            continue
        try:
            generated = uuid.UUID(str(value))
        except ValueError:
            continue  # a deliberately malformed id (negative data): keep it
        if generated.int % 4:
            case.path_parameters[name] = str(rows[generated.int % len(rows)].pk)
    _with_a_real_webhook(case)


def _with_a_real_webhook(case: Any) -> None:
    """Most generated webhook ids name a real endpoint, and its delivery with it."""
    parameters = case.path_parameters or {}
    try:
        generated = uuid.UUID(str(parameters.get("webhook_id")))
    except ValueError:
        return  # none, or a deliberately malformed id
    deliveries = list(WebhookDelivery.objects.order_by("id"))
    if deliveries and generated.int % 4:
        chosen = deliveries[generated.int % len(deliveries)]
        parameters["webhook_id"] = str(chosen.endpoint_id)
        if "delivery_id" in parameters:
            parameters["delivery_id"] = str(chosen.uid)


def _breaks_its_headers(case: Any) -> bool:
    """A negative case whose headers are what it gets wrong. The API's one header is its
    key, so such a case dropped or mangled it: adding a valid key would turn it into a
    valid request, which the server rightly accepts (and the negative-data check would
    then blame the server). It goes out with its own headers, to be refused."""
    header = case.meta.components.get(ParameterLocation.HEADER) if case.meta else None
    return header is not None and header.mode == GenerationMode.NEGATIVE


def _checks_for(case: Any) -> list[Any]:
    """A multipart body carries text only: a negative case that puts a number where a
    string is due sends the text "0.5", a valid string, which the server rightly
    accepts (seen once: an artifact's `content_type`). Such a case is not negative data
    on the wire, so the negative-data check does not apply to it."""
    body = case.meta.components.get(ParameterLocation.BODY) if case.meta else None
    negative = body is not None and body.mode == GenerationMode.NEGATIVE
    if negative and str(case.media_type or "").startswith("multipart/"):
        return [check for check in CHECKS if check is not negative_data_rejection]
    return CHECKS


def _call_and_validate(
    case: Any, tenant: Tenant, runs: list[Run], schedules: list[Schedule]
) -> None:
    _with_real_ids(case, runs, schedules)
    key = {} if _breaks_its_headers(case) else {"Authorization": f"Bearer {tenant.key}"}
    case.call_and_validate(headers=key, checks=_checks_for(case))


@pytest.mark.django_db
@schema.include(operation_id=PLAN_BODIES).parametrize()
@settings(max_examples=5, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_bodies_with_a_plan_conform_to_the_schema(
    case: Any, rich_tenant: tuple[Tenant, list[Run], list[Schedule]]
) -> None:
    _call_and_validate(case, *rich_tenant)


@pytest.mark.django_db
@schema.exclude(operation_id=PLAN_BODIES).parametrize()
@settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_every_other_operation_conforms_to_the_schema(
    case: Any, rich_tenant: tuple[Tenant, list[Run], list[Schedule]]
) -> None:
    _call_and_validate(case, *rich_tenant)
