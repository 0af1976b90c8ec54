"""The webhooks API: register (the secret shown once), list, read, change, delete, ping,
deliveries with their attempts, redeliver; validation, another organization, scopes."""

from __future__ import annotations

import json
from typing import Any

import pytest
from rest_framework.test import APIClient

from api.models import IdempotencyRecord
from billing.models import ApiKeyScope
from billing.secrets import decrypt_value
from billing.services import api_key_create
from runs.services import run_cancel
from tests import factories
from tests.tenants import Tenant, make_tenant
from webhooks.models import WebhookAttempt, WebhookDelivery, WebhookEndpoint
from webhooks.services import AttemptResult, attempt_record, deliveries_claim

pytestmark = pytest.mark.django_db

HOOKS = "/api/v1/webhooks"
BODY = {"url": "https://hooks.example.com/in", "events": ["run.completed", "run.cancelled"]}


@pytest.fixture
def tenant() -> Tenant:
    return make_tenant()


def create(tenant: Tenant, **body: Any) -> dict[str, Any]:
    response = tenant.post(HOOKS, {**BODY, **body})
    assert response.status_code == 201, response.json()
    created: dict[str, Any] = response.json()
    return created


def test_a_registered_endpoint_shows_its_generated_secret_once(tenant: Tenant) -> None:
    created = create(tenant)

    stored = WebhookEndpoint.objects.get(pk=created["id"])
    assert created["secret"].startswith("whsec_")
    assert decrypt_value(stored.secret_encrypted) == created["secret"]
    assert created["secret"].encode() not in bytes(stored.secret_encrypted)
    shown = tenant.get(f"{HOOKS}/{created['id']}").json()
    assert "secret" not in shown
    assert {k: shown[k] for k in ("url", "events", "enabled")} == {
        "url": BODY["url"],
        "events": ["run.cancelled", "run.completed"],
        "enabled": True,
    }
    listed = tenant.get(HOOKS).json()
    assert (listed["count"], [row["id"] for row in listed["results"]]) == (1, [created["id"]])
    assert "secret" not in listed["results"][0]


def test_a_secret_given_is_the_one_used(tenant: Tenant) -> None:
    created = create(tenant, secret="my-own-secret-of-enough-length")

    assert created["secret"] == "my-own-secret-of-enough-length"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"url": "ftp://example.com/"}, "url"),
        ({"url": "https:///nohost"}, "url"),
        ({"url": 5}, "url"),
        ({"events": []}, "events"),
        ({"events": ["run.started"]}, "events[0]"),
        ({"events": "run.completed"}, "events"),
        ({"secret": "short"}, "secret"),
        ({"colour": "blue"}, "colour"),
    ],
)
def test_bad_input_is_400_naming_the_field_and_stores_nothing(
    tenant: Tenant, body: dict[str, Any], field: str
) -> None:
    response = tenant.post(HOOKS, {**BODY, **body})

    assert response.status_code == 400, response.json()
    assert response.json()["code"] == "invalid_request"
    assert field in [problem["path"] for problem in response.json()["details"]]
    assert not WebhookEndpoint.objects.exists()


def test_a_change_applies_the_fields_given_and_disabling_says_so(tenant: Tenant) -> None:
    created = create(tenant)

    changed = tenant.client.patch(
        f"{HOOKS}/{created['id']}",
        {"events": ["run.failed"], "enabled": False},
        format="json",
    )

    assert changed.status_code == 200, changed.json()
    assert changed.json()["events"] == ["run.failed"]
    assert changed.json()["url"] == BODY["url"]
    assert (changed.json()["enabled"], changed.json()["disabled_reason"]) == (
        False,
        "disabled by its organization",
    )
    bad = tenant.client.patch(f"{HOOKS}/{created['id']}", {"url": "nope"}, format="json")
    assert bad.status_code == 400
    assert WebhookEndpoint.objects.get(pk=created["id"]).url == BODY["url"]
    again = tenant.client.patch(f"{HOOKS}/{created['id']}", {"enabled": True}, format="json")
    assert (again.json()["enabled"], again.json()["disabled_reason"]) == (True, "")


def test_a_delete_removes_the_endpoint_and_its_deliveries(tenant: Tenant) -> None:
    created = create(tenant)
    tenant.post(f"{HOOKS}/{created['id']}/test")

    assert tenant.client.delete(f"{HOOKS}/{created['id']}").status_code == 204
    assert tenant.client.delete(f"{HOOKS}/{created['id']}").status_code == 404
    assert not WebhookDelivery.objects.exists()


def test_deliveries_list_every_attempt_and_one_can_be_sent_again(tenant: Tenant) -> None:
    created = create(tenant)
    run = factories.run(tenant.organization)
    run_cancel(run_id=run.pk, reason="test")
    ping = tenant.post(f"{HOOKS}/{created['id']}/test")
    assert ping.status_code == 202, ping.json()
    assert (ping.json()["type"], ping.json()["status"]) == ("webhook.test", "pending")
    for claim in deliveries_claim(limit=10, per_endpoint=5, lease_seconds=60):
        attempt_record(
            delivery_id=claim.delivery_id,
            token=claim.token,
            result=AttemptResult(status_code=410, error="HTTP 410: gone", duration_ms=12),
        )

    page = tenant.get(f"{HOOKS}/{created['id']}/deliveries").json()

    assert page["count"] == 2
    by_type = {row["type"]: row for row in page["results"]}
    cancelled = by_type["run.cancelled"]
    assert (cancelled["run"], cancelled["status"], cancelled["last_status_code"]) == (
        str(run.pk),
        "failed",
        410,
    )
    assert [(a["number"], a["status_code"], a["duration_ms"]) for a in cancelled["attempts"]] == [
        (1, 410, 12)
    ]
    again = tenant.post(f"{HOOKS}/{created['id']}/deliveries/{cancelled['id']}/redeliver")
    assert again.status_code == 202, again.json()
    assert (again.json()["id"], again.json()["status"]) == (cancelled["id"], "pending")
    assert WebhookAttempt.objects.count() == 2  # kept


def test_another_organizations_endpoint_and_delivery_are_404(tenant: Tenant) -> None:
    created = create(tenant)
    ping = tenant.post(f"{HOOKS}/{created['id']}/test").json()
    other = make_tenant()

    for method, path in [
        ("get", f"{HOOKS}/{created['id']}"),
        ("patch", f"{HOOKS}/{created['id']}"),
        ("delete", f"{HOOKS}/{created['id']}"),
        ("post", f"{HOOKS}/{created['id']}/test"),
        ("get", f"{HOOKS}/{created['id']}/deliveries"),
        ("post", f"{HOOKS}/{created['id']}/deliveries/{ping['id']}/redeliver"),
    ]:
        response = getattr(other.client, method)(path, {}, format="json")
        assert response.status_code == 404, (method, path)
        assert response.json()["code"] == "not_found"
    assert other.get(HOOKS).json()["count"] == 0
    assert WebhookDelivery.objects.count() == 1


def test_a_read_key_lists_and_a_full_key_writes(tenant: Tenant) -> None:
    created = create(tenant)
    _, key = api_key_create(organization=tenant.organization, name="r", scope=ApiKeyScope.READ)
    reader = APIClient()
    reader.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")

    assert reader.get(HOOKS).status_code == 200
    assert reader.get(f"{HOOKS}/{created['id']}/deliveries").status_code == 200
    refused = reader.post(HOOKS, BODY, format="json")
    assert (refused.status_code, refused.json()["code"]) == (403, "insufficient_scope")
    assert reader.post(f"{HOOKS}/{created['id']}/test", {}, format="json").status_code == 403
    assert WebhookEndpoint.objects.count() == 1


def test_a_run_ended_while_an_endpoint_is_disabled_says_so_in_its_events(tenant: Tenant) -> None:
    created = create(tenant)
    tenant.client.patch(f"{HOOKS}/{created['id']}", {"enabled": False}, format="json")
    run = factories.run(tenant.organization)
    run_cancel(run_id=run.pk, reason="test")

    events = tenant.get(f"/api/v1/runs/{run.pk}/events").json()["results"]

    (told,) = [event for event in events if event["entity"] == "webhook"]
    assert told["entity_id"] == created["id"]
    assert "disabled by its organization" in told["message"]
    assert "run.cancelled was not sent" in told["message"]


def test_a_test_past_the_pending_bound_is_429_with_retry_after(
    tenant: Tenant, settings: Any
) -> None:
    settings.WEBHOOK_MAX_PENDING = 2  # the bound's count is tests/webhooks/test_fairness.py's
    created = create(tenant)
    for _ in range(2):
        assert tenant.post(f"{HOOKS}/{created['id']}/test").status_code == 202

    refused = tenant.post(f"{HOOKS}/{created['id']}/test")

    assert refused.status_code == 429
    assert refused.json()["code"] == "too_many_pending_deliveries"
    assert refused.json()["details"] == {"retry_after": 10, "limit": 2}
    assert refused["Retry-After"] == "10"
    assert WebhookDelivery.objects.filter(endpoint_id=created["id"]).count() == 2


def test_a_retried_create_replays_the_secret_which_its_stored_record_holds_sealed(
    tenant: Tenant,
) -> None:
    key = {"Idempotency-Key": "create-hook-1"}
    first = tenant.post(HOOKS, BODY, **key)
    assert first.status_code == 201, first.json()
    secret = first.json()["secret"]

    record = IdempotencyRecord.objects.get(key="create-hook-1")
    assert secret not in json.dumps(record.response_body)
    sealed = record.response_body["secret"]["sealed"]
    assert decrypt_value(sealed.encode()) == secret
    again = tenant.post(HOOKS, BODY, **key)

    # The replay answers as the first answer did, the secret decrypted; nothing new.
    assert again.status_code == 200
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.json() == first.json()
    assert WebhookEndpoint.objects.filter(organization=tenant.organization).count() == 1
