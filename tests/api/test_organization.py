"""GET /api/v1/organization (limits and their use) and the refusal of one pending run too
many (429 too_many_pending_runs): nothing is written when it is refused."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from billing.models import LedgerEntry, Reservation
from billing.services import api_key_create
from runs.admission import run_admission
from runs.models import Run
from tests import factories
from tests.tenants import Tenant

pytestmark = pytest.mark.django_db


def test_the_organization_shows_the_default_limits_and_nothing_in_use(
    tenant: Tenant, settings: Any
) -> None:
    settings.ORG_MAX_RUNNING_RUNS = 7
    settings.ORG_MAX_RUNNING_STEPS = 70
    settings.ORG_MAX_PENDING_RUNS = 700

    response = tenant.get("/api/v1/organization")

    assert response.status_code == 200
    assert response.json() == {
        "id": str(tenant.organization.pk),
        "name": tenant.organization.name,
        "limits": {
            "max_running_runs": 7,
            "max_running_steps": 70,
            "max_pending_runs": 700,
            "share": 1,
        },
        "usage": {"runs_running": 0, "runs_queued": 0, "runs_pending": 0, "steps_executing": 0},
        "quotas": {
            "webhook_endpoints": {"limit": settings.QUOTA_WEBHOOK_ENDPOINTS, "used": 0},
            "schedules": {"limit": settings.QUOTA_SCHEDULES, "used": 0},
            "rate_limits": {"limit": settings.QUOTA_RATE_LIMITS, "used": 0},
            "event_streams": {"limit": settings.QUOTA_EVENT_STREAMS, "used": 0},
            "runner_polls": {"limit": settings.QUOTA_RUNNER_POLLS, "used": 0},
            "webhooks_in_flight": {"limit": settings.QUOTA_WEBHOOKS_IN_FLIGHT, "used": 0},
            "artifacts": {"limit": settings.QUOTA_ARTIFACTS, "used": 0},
            "artifact_bytes": {"limit": settings.QUOTA_ARTIFACT_BYTES, "used": 0},
            "parked_waits": {"limit": settings.QUOTA_PARKED_WAITS, "used": 0},
        },
    }


def test_the_organization_shows_its_own_limits_once_set_and_the_runs_in_use(
    tenant: Tenant,
) -> None:
    run_admission.limits_set(
        tenant.organization.pk, actor="test", max_running_runs=1, max_pending_runs=5, share=3
    )
    for _ in range(3):
        created = tenant.post("/api/v1/runs", {"plan": factories.plan(), "start": True})
        assert created.status_code == 201
    first, second, _ = Run.objects.filter(organization=tenant.organization).order_by("created_at")
    assert run_admission.admit(first.pk)  # as a worker's pick-up would
    assert not run_admission.admit(second.pk)

    body = tenant.get("/api/v1/organization").json()

    assert body["limits"]["max_running_runs"] == 1
    assert body["limits"]["max_pending_runs"] == 5
    assert body["limits"]["share"] == 3
    assert body["usage"] == {
        "runs_running": 1,
        "runs_queued": 1,
        "runs_pending": 3,
        "steps_executing": 0,
    }
    run = tenant.get(f"/api/v1/runs/{second.pk}").json()
    assert run["status"] == "pending"
    assert run["queued_reason"] == (
        "the organization has 1 runs running, its limit (max_running_runs 1)"
    )


def test_one_pending_run_too_many_is_refused_with_429_and_nothing_written(
    tenant: Tenant,
) -> None:
    run_admission.limits_set(tenant.organization.pk, actor="test", max_pending_runs=2)
    for _ in range(2):
        assert (
            tenant.post("/api/v1/runs", {"plan": factories.plan(), "start": True}).status_code
            == 201
        )
    runs_before = Run.objects.count()
    ledger_before = LedgerEntry.objects.count()
    reservations_before = Reservation.objects.count()

    refused = tenant.post("/api/v1/runs", {"plan": factories.plan(), "start": True})

    assert refused.status_code == 429
    assert refused["Retry-After"] == "10"
    assert refused.json() == {
        "code": "too_many_pending_runs",
        "message": "the organization has 2 runs waiting to start, its limit; "
        "try again when some have started",
        "details": {"retry_after": 10},
    }
    assert Run.objects.count() == runs_before  # create and start are one transaction
    assert LedgerEntry.objects.count() == ledger_before
    assert Reservation.objects.count() == reservations_before

    # A run created first and started later is refused alike, and stays CREATED.
    created = tenant.post("/api/v1/runs", {"plan": factories.plan()}).json()
    again = tenant.post(f"/api/v1/runs/{created['id']}/start")
    assert again.status_code == 429
    assert again.json()["code"] == "too_many_pending_runs"
    assert Run.objects.get(pk=created["id"]).status == "created"

    # Raised, the limit lets it start at once.
    run_admission.limits_set(tenant.organization.pk, actor="test", max_pending_runs=3)
    assert tenant.post(f"/api/v1/runs/{created['id']}/start").status_code == 200


def test_limits_are_validated_and_none_goes_back_to_the_setting(
    tenant: Tenant, settings: Any
) -> None:
    settings.ORG_MAX_RUNNING_RUNS = 9
    organization = tenant.organization
    with pytest.raises(run_admission.InvalidLimits):
        run_admission.limits_set(organization.pk, actor="test", max_running_runs=0)
    with pytest.raises(run_admission.InvalidLimits):
        run_admission.limits_set(organization.pk, actor="test", share=None)
    with pytest.raises(run_admission.InvalidLimits):
        run_admission.limits_set(organization.pk, actor="test", max_running_jobs=3)
    run_admission.limits_set(organization.pk, actor="test", max_running_runs=2)
    assert run_admission.limits_of(organization.pk).max_running_runs == 2
    assert (
        run_admission.limits_set(
            organization.pk, actor="test", max_running_runs=None
        ).max_running_runs
        == 9
    )


def test_a_read_key_may_see_the_organization(tenant: Tenant) -> None:
    _, read_key = api_key_create(organization=tenant.organization, scope="read")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {read_key}")
    assert client.get("/api/v1/organization").status_code == 200
