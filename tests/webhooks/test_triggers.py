"""Deliveries are written by PostgreSQL in the transaction of the state change they
announce, whatever code made it: a transition, a raw UPDATE like the engine's hot path,
an escalation ticket opened. Rolled back, nothing is left."""

from __future__ import annotations

import pytest
from django.db import connection, transaction
from django.utils import timezone

from runs.models import EscalationTicket, Run
from runs.selectors import run_history
from runs.services import run_cancel
from tests import factories
from tests.webhooks.support import endpoint
from webhooks import services
from webhooks.models import WebhookDelivery

pytestmark = pytest.mark.django_db


def test_a_run_that_ends_has_one_delivery_per_subscribed_enabled_endpoint() -> None:
    run = factories.run()
    wanted = endpoint(run.organization, events=["run.cancelled"])
    endpoint(run.organization, events=["run.completed"])  # not subscribed to cancels
    endpoint(factories.org(), events=["run.cancelled"])  # another organization's

    run_cancel(run_id=run.pk, reason="test")

    (delivery,) = WebhookDelivery.objects.all()
    assert (delivery.endpoint_id, delivery.run_id, delivery.event_type, delivery.status) == (
        wanted.pk,
        run.pk,
        "run.cancelled",
        "pending",
    )
    assert delivery.payload["run"]["id"] == str(run.pk)
    assert delivery.payload["run"]["status"] == "cancelled"
    assert delivery.payload["run"]["name"] == run.name
    assert delivery.next_attempt_at <= timezone.now()


def test_a_state_change_rolled_back_leaves_no_delivery() -> None:
    run = factories.run()
    endpoint(run.organization)

    seen_inside = []

    def cancel_then_fail() -> None:
        with transaction.atomic():
            run_cancel(run_id=run.pk, reason="test")
            seen_inside.append(WebhookDelivery.objects.count())  # written with the change
            raise RuntimeError("the transaction fails after the change")

    with pytest.raises(RuntimeError):
        cancel_then_fail()

    assert seen_inside == [1]

    assert WebhookDelivery.objects.count() == 0
    assert Run.objects.get(pk=run.pk).status != "cancelled"


@pytest.mark.parametrize("status", ["completed", "failed", "waiting_approval"])
def test_a_raw_update_of_the_status_like_the_engines_sql_is_announced_too(status: str) -> None:
    run = factories.run()
    endpoint(run.organization)
    with connection.cursor() as cursor:
        cursor.execute("UPDATE runs_run SET status = %s WHERE id = %s", [status, run.pk])
        cursor.execute("UPDATE runs_run SET status = %s WHERE id = %s", [status, run.pk])

    # Once: the second UPDATE does not change the status.
    assert list(WebhookDelivery.objects.values_list("event_type", flat=True)) == [f"run.{status}"]


def test_statuses_that_are_not_events_are_not_announced() -> None:
    run = factories.run()
    endpoint(run.organization)
    for status in ("pending", "running", "paused", "resuming", "escalated"):
        Run.objects.filter(pk=run.pk).update(status=status)
    assert WebhookDelivery.objects.count() == 0


def test_an_escalation_opened_is_announced_with_its_ticket() -> None:
    run = factories.run()
    endpoint(run.organization, events=["escalation.opened"])
    ticket = EscalationTicket.objects.create(
        organization=run.organization,
        run=run,
        attempt_number=1,
        reason="error_burst",
        opened_at=timezone.now(),
        errors=[{"code": "timeout"}],
    )
    (delivery,) = WebhookDelivery.objects.all()
    assert delivery.event_type == "escalation.opened"
    assert delivery.payload["escalation"]["id"] == str(ticket.pk)
    assert delivery.payload["escalation"]["errors"] == [{"code": "timeout"}]
    assert delivery.payload["run"]["id"] == str(run.pk)


def test_a_disabled_endpoint_gets_nothing_and_the_run_says_why() -> None:
    run = factories.run()
    gone = endpoint(run.organization)
    services.endpoint_update(endpoint_id=gone.pk, enabled=False)

    run_cancel(run_id=run.pk, reason="test")

    assert WebhookDelivery.objects.count() == 0
    told = run_history(run).get(entity="webhook")
    assert told.entity_id == str(gone.pk)
    assert "is disabled (disabled by its organization)" in told.message
    assert told.payload["event"] == "run.cancelled"


def test_a_runs_deliveries_are_ordered_by_id_as_written() -> None:
    run = factories.run()
    endpoint(run.organization)
    Run.objects.filter(pk=run.pk).update(status="waiting_approval")
    Run.objects.filter(pk=run.pk).update(status="running")
    Run.objects.filter(pk=run.pk).update(status="completed")
    types = WebhookDelivery.objects.order_by("id").values_list("event_type", flat=True)
    assert list(types) == ["run.waiting_approval", "run.completed"]
