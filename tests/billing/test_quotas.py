"""Quotas (billing/quotas.py): the setting unless the organization has its own, set through
one service (the admin, `manage.py set_limits`), and exact when two creates race for the
last place."""

from __future__ import annotations

import json
import threading
from io import StringIO
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.db import connection, transaction
from django.test import Client

from billing import quotas
from billing.models import Organization
from billing.quotas import QuotaExceeded
from tests import factories
from tests.support import wait_until
from webhooks.models import WebhookEndpoint
from webhooks.services import endpoint_create

HOOK = "https://hooks.example.com/orchestrator"


@pytest.mark.django_db
def test_a_quota_is_the_setting_until_the_organization_has_its_own(settings: Any) -> None:
    settings.QUOTA_SCHEDULES = 7
    organization = factories.org()

    assert quotas.quota_of(organization, quotas.SCHEDULES) == 7
    assert quotas.quotas_set(organization.pk, actor="test", schedules=0, event_streams=3) == {
        "webhook_endpoints": settings.QUOTA_WEBHOOK_ENDPOINTS,
        "schedules": 0,
        "rate_limits": settings.QUOTA_RATE_LIMITS,
        "event_streams": 3,
        "runner_polls": settings.QUOTA_RUNNER_POLLS,
        "webhooks_in_flight": settings.QUOTA_WEBHOOKS_IN_FLIGHT,
        "artifacts": settings.QUOTA_ARTIFACTS,
        "artifact_bytes": settings.QUOTA_ARTIFACT_BYTES,
        "parked_waits": settings.QUOTA_PARKED_WAITS,
    }
    assert quotas.quotas_set(organization.pk, actor="test", schedules=None)["schedules"] == 7


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("wanted", "message"),
    [
        ({"schedules": -1}, "schedules must be a whole number of at least 0"),
        ({"schedules": True}, "schedules must be a whole number of at least 0"),
        ({"webhooks": 3}, "unknown quotas: webhooks"),
    ],
)
def test_quotas_are_validated_and_nothing_is_written_on_a_problem(
    wanted: dict[str, Any], message: str
) -> None:
    organization = factories.org()
    with pytest.raises(quotas.InvalidQuotas, match=message):
        quotas.quotas_set(organization.pk, actor="test", **wanted)
    organization.refresh_from_db()
    assert organization.quota_schedules is None


@pytest.mark.django_db(transaction=True)  # outside any transaction, as a caller may be
def test_a_quota_is_checked_only_inside_the_creates_transaction() -> None:
    organization = factories.org()
    with pytest.raises(RuntimeError, match="transaction"):
        quotas.check_quota(
            organization, quotas.WEBHOOK_ENDPOINTS, held=WebhookEndpoint.objects.none()
        )


def _waiting_for_a_quota_lock() -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
            "AND classid = %s",
            [quotas.LOCK_NAMESPACE],
        )
        return bool(cursor.fetchone()[0])


@pytest.mark.django_db(transaction=True)
def test_two_creates_at_once_never_both_take_the_last_place() -> None:
    """The first create holds its transaction open after its check; the second must wait
    for it (seen in pg_locks), then count its row and be refused. Without the quota's
    lock the second counts only what was committed, nothing, and both are created."""
    organization = factories.org()
    quotas.quotas_set(organization.pk, actor="test", webhook_endpoints=1)
    organization.refresh_from_db()
    first_checked, first_may_commit = threading.Event(), threading.Event()
    outcomes: dict[str, str] = {}

    def first() -> None:
        try:
            with transaction.atomic():
                endpoint_create(organization=organization, url=HOOK, events=["run.failed"])
                first_checked.set()
                first_may_commit.wait(30)
            outcomes["first"] = "created"
        finally:
            connection.close()

    def second() -> None:
        try:
            endpoint_create(organization=organization, url=HOOK, events=["run.failed"])
            outcomes["second"] = "created"
        except QuotaExceeded as exc:
            outcomes["second"] = f"refused: {exc.details}"
        finally:
            connection.close()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    threads[0].start()
    assert first_checked.wait(30)
    threads[1].start()
    wait_until(_waiting_for_a_quota_lock, what="the second create to wait for the quota's lock")
    first_may_commit.set()
    for thread in threads:
        thread.join(30)

    assert outcomes == {
        "first": "created",
        "second": "refused: {'quota': 'webhook_endpoints', 'limit': 1}",
    }
    assert WebhookEndpoint.objects.filter(organization=organization).count() == 1


# --------------------------------------------------------------------------- operators
@pytest.mark.django_db
def test_set_limits_sets_quotas_through_the_service_and_prints_them(settings: Any) -> None:
    organization = factories.org(name="quoted")
    out = StringIO()

    call_command(
        "set_limits",
        "quoted",
        "--quota-webhook-endpoints",
        "5",
        "--quota-event-streams",
        "0",
        "--quota-artifact-bytes",
        "1000",
        "--share",
        "2",
        stdout=out,
    )

    printed = json.loads(out.getvalue())
    assert printed["share"] == 2
    assert printed["quotas"] == {
        "webhook_endpoints": 5,
        "schedules": settings.QUOTA_SCHEDULES,
        "rate_limits": settings.QUOTA_RATE_LIMITS,
        "event_streams": 0,
        "runner_polls": settings.QUOTA_RUNNER_POLLS,
        "webhooks_in_flight": settings.QUOTA_WEBHOOKS_IN_FLIGHT,
        "artifacts": settings.QUOTA_ARTIFACTS,
        "artifact_bytes": 1000,
        "parked_waits": settings.QUOTA_PARKED_WAITS,
    }
    organization.refresh_from_db()
    assert (organization.quota_webhook_endpoints, organization.quota_event_streams) == (5, 0)

    call_command("set_limits", "quoted", "--quota-webhook-endpoints", "default", stdout=out)
    organization.refresh_from_db()
    assert organization.quota_webhook_endpoints is None


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--quota-schedules", "many"], "--quota-schedules: not a whole number"),
        (["--quota-schedules", "-2"], "schedules must be a whole number of at least 0"),
        # A bad limit beside a good quota: neither is written.
        (["--quota-schedules", "4", "--max-running-runs", "0"], "max_running_runs must be"),
    ],
)
def test_set_limits_refuses_a_bad_quota_and_changes_nothing(
    arguments: list[str], message: str
) -> None:
    organization = factories.org(name="quoted")
    with pytest.raises(CommandError, match=message):
        call_command("set_limits", "quoted", *arguments, stdout=StringIO())
    organization.refresh_from_db()
    assert (organization.quota_schedules, organization.max_running_runs) == (None, None)


@pytest.mark.django_db
def test_the_admin_sets_quotas_through_the_service(client: Client) -> None:
    client.force_login(User.objects.create_superuser("ops", "ops@example.com", "pw-123456789"))
    organization = factories.org(name="acme")
    quotas.quotas_set(organization.pk, actor="test", rate_limits=9)
    url = f"/admin/billing/organization/{organization.pk}/change/"
    page = client.get(url).content.decode()
    assert 'name="quota_rate_limits" value="9"' in page

    form = {
        "name": "acme",
        "api_keys-TOTAL_FORMS": "0",
        "api_keys-INITIAL_FORMS": "0",
        "share": "1",
        "quota_webhook_endpoints": "3",
        "quota_schedules": "",
        "quota_rate_limits": "",
        "quota_event_streams": "12",
        "quota_runner_polls": "7",
        "quota_webhooks_in_flight": "",
        "quota_artifacts": "",
        "quota_artifact_bytes": "5000000000",
    }
    refused = client.post(url, {**form, "quota_schedules": "-1"})
    assert refused.status_code == 200
    assert b"Ensure this value is greater than or equal to 0" in refused.content
    saved = client.post(url, form)

    assert saved.status_code == 302
    organization = Organization.objects.get(pk=organization.pk)
    assert (
        organization.quota_webhook_endpoints,
        organization.quota_schedules,
        organization.quota_rate_limits,
        organization.quota_event_streams,
        organization.quota_runner_polls,
        organization.quota_webhooks_in_flight,
        organization.quota_artifacts,
        organization.quota_artifact_bytes,
    ) == (3, None, None, 12, 7, None, None, 5_000_000_000)
