"""Whose deliveries a sweep claims (webhooks/sql/webhook_claim.sql): an endpoint's
and an organization's in-flight bounds applied inside the claim, organizations served in
turns, a suspended organization's deliveries held; the bound on what a test or a
redelivery may add to an endpoint's pending deliveries, and an endpoint disabled past its
backlog bound (webhooks.services)."""

from __future__ import annotations

from typing import Any

import pytest
from django.conf import settings
from django.utils import timezone

from billing import quotas
from billing.models import Organization
from common import metrics
from runs.selectors import run_history
from runs.services import run_cancel
from tests import factories
from tests.webhooks.support import endpoint
from webhooks import services
from webhooks.models import WebhookDelivery, WebhookEndpoint

pytestmark = pytest.mark.django_db


def claim(limit: int, per_endpoint: int = 1) -> list[int]:
    claims = services.deliveries_claim(limit=limit, per_endpoint=per_endpoint, lease_seconds=60)
    return [c.delivery_id for c in claims]


def backlog(
    organization: Organization, endpoints: int = 5, each: int = 10
) -> list[WebhookEndpoint]:
    """``endpoints`` endpoints of the organization with ``each`` pending deliveries, all
    due before anything a test makes after."""
    hooks = [endpoint(organization, f"http://127.0.0.1:9/busy-{n}") for n in range(endpoints)]
    for hook in hooks:
        for _ in range(each):
            services.endpoint_test(endpoint_id=hook.pk)
    return hooks


def ping(organization: Organization, path: str = "/hook") -> WebhookDelivery:
    return services.endpoint_test(
        endpoint_id=endpoint(organization, f"http://127.0.0.1:9{path}").pk
    )


def test_endpoints_whose_places_are_taken_do_not_fill_the_batch() -> None:
    busy = backlog(factories.org())
    assert len(claim(limit=50)) == len(busy)  # one in flight to each, 45 left due
    waiting = ping(factories.org())

    # A batch of one: the held endpoints' due deliveries are not candidates at all.
    assert claim(limit=1) == [waiting.pk]


def test_organizations_take_turns_whatever_the_size_of_their_backlog() -> None:
    backlog(factories.org())  # 5 endpoints, 50 deliveries, all due before the others'
    others = [ping(factories.org(), f"/other-{n}") for n in range(3)]

    claimed = claim(limit=4)

    # Each organization's first before the backlog's second.
    assert len(claimed) == 4
    assert {d.pk for d in others} <= set(claimed)


def test_an_organizations_turns_go_round_its_endpoints_first() -> None:
    organization = factories.org()
    first = endpoint(organization, "http://127.0.0.1:9/first")
    early = [services.endpoint_test(endpoint_id=first.pk) for _ in range(3)]
    later = services.endpoint_test(endpoint_id=endpoint(organization, "http://127.0.0.1:9/2").pk)

    assert sorted(claim(limit=2, per_endpoint=3)) == sorted([early[0].pk, later.pk])


def test_a_suspended_organizations_deliveries_are_held_until_it_is_unsuspended() -> None:
    organization = factories.org()
    held = ping(organization)
    sent = ping(factories.org())
    # The suspension's own doors (the operators' commands) only set this field.
    Organization.objects.filter(pk=organization.pk).update(suspended_at=timezone.now())

    assert claim(limit=10) == [sent.pk]
    assert services.deliveries_next_due() is not None  # `sent`'s lease
    WebhookDelivery.objects.filter(pk=sent.pk).update(status="delivered")
    assert services.deliveries_next_due() is None  # beat sends no sweep for held ones
    assert WebhookDelivery.objects.get(pk=held.pk).status == "pending"

    Organization.objects.filter(pk=organization.pk).update(suspended_at=None)

    assert services.deliveries_next_due() is not None
    assert claim(limit=10) == [held.pk]


def test_tests_and_redeliveries_stop_at_the_pending_bound_run_events_do_not() -> None:
    limit = settings.WEBHOOK_MAX_PENDING
    assert limit == 100
    hook = endpoint(factories.org())
    run = factories.run(hook.organization)
    run_cancel(run_id=run.pk, reason="done")  # delivered below, then redelivered
    (done,) = claim(limit=1)
    WebhookDelivery.objects.filter(pk=done).update(status="delivered")
    for _ in range(limit):
        services.endpoint_test(endpoint_id=hook.pk)

    with pytest.raises(services.TooManyPendingDeliveries) as refused:
        services.endpoint_test(endpoint_id=hook.pk)
    assert (refused.value.code, refused.value.limit) == ("too_many_pending_deliveries", limit)
    with pytest.raises(services.TooManyPendingDeliveries):
        services.delivery_redeliver(delivery_uid=WebhookDelivery.objects.get(pk=done).uid)
    # A pending one sent again adds nothing: not refused.
    pending = WebhookDelivery.objects.filter(endpoint=hook, status="pending").first()
    assert pending is not None
    services.delivery_redeliver(delivery_uid=pending.uid)
    # A run's event is written with its change, whatever is pending.
    run_cancel(run_id=factories.run(hook.organization).pk, reason="done")
    assert WebhookDelivery.objects.filter(endpoint=hook, status="pending").count() == limit + 1

    WebhookDelivery.objects.filter(endpoint=hook, status="pending").update(status="failed")
    services.endpoint_test(endpoint_id=hook.pk)  # room again once they are sent


def lease_ended(*delivery_ids: int) -> None:
    """Their sends answered: the places they held are free."""
    WebhookDelivery.objects.filter(pk__in=delivery_ids).update(
        status="delivered", lease_until=None, lease_token=None
    )


def test_an_organization_has_at_most_its_quota_in_flight_across_its_endpoints(
    settings: Any,
) -> None:
    assert settings.QUOTA_WEBHOOKS_IN_FLIGHT == 5
    busy = factories.org()
    backlog(busy, endpoints=8, each=2)

    first = claim(limit=50)
    other = ping(factories.org())

    assert len(first) == 5  # not 8: one in flight to each endpoint, 5 in all
    assert claim(limit=50) == [other.pk]  # its turns wait while its five are sent
    lease_ended(first[0])
    assert len(claim(limit=50)) == 1  # a place freed, a place taken
    quotas.quotas_set(busy.pk, actor="test", webhooks_in_flight=2)
    lease_ended(*first[1:])
    assert len(claim(limit=50)) == 1  # 1 still in flight, of its own quota of 2
    assert services.deliveries_in_flight(organization=busy).count() == 2


def test_an_endpoint_with_more_pending_than_the_backlog_bound_is_disabled_at_its_next_attempt(
    settings: Any, django_capture_on_commit_callbacks: Any
) -> None:
    settings.WEBHOOK_MAX_BACKLOG = 3
    hook = endpoint(factories.org())
    cancelled = [factories.run(hook.organization) for _ in range(4)]
    for run in cancelled:  # run events: never refused, each a pending delivery
        run_cancel(run_id=run.pk, reason="done")
    (claimed,) = services.deliveries_claim(limit=1, per_endpoint=1, lease_seconds=60)
    disabled_before = counted_disabled("backlog")

    with django_capture_on_commit_callbacks(execute=True):
        services.attempt_record(
            delivery_id=claimed.delivery_id,
            token=claimed.token,
            result=services.AttemptResult(status_code=None, error="timeout", duration_ms=1000),
        )

    hook.refresh_from_db()
    assert not hook.enabled
    assert hook.disabled_reason == (
        "more than 3 deliveries pending (WEBHOOK_MAX_BACKLOG; 4 counted): its receiver does "
        "not keep up; enable it again to send them"
    )
    assert counted_disabled("backlog") == disabled_before + 1
    # Its backlog is kept, to be sent when it is enabled again; new events are not queued
    # but told in the run's timeline.
    assert WebhookDelivery.objects.filter(endpoint=hook, status="pending").count() == 4
    later = factories.run(hook.organization)
    run_cancel(run_id=later.pk, reason="done")
    assert WebhookDelivery.objects.filter(endpoint=hook).count() == 4
    told = run_history(later).filter(entity="webhook").get()
    assert "is disabled (more than 3 deliveries pending" in told.message


def test_an_endpoint_at_the_backlog_bound_stays_enabled(settings: Any) -> None:
    settings.WEBHOOK_MAX_BACKLOG = 3
    hook = endpoint(factories.org())
    for _ in range(3):
        run_cancel(run_id=factories.run(hook.organization).pk, reason="done")
    (claimed,) = services.deliveries_claim(limit=1, per_endpoint=1, lease_seconds=60)

    services.attempt_record(
        delivery_id=claimed.delivery_id,
        token=claimed.token,
        result=services.AttemptResult(status_code=500, error="HTTP 500", duration_ms=5),
    )

    hook.refresh_from_db()
    assert hook.enabled


def counted_disabled(cause: str) -> int:
    return int(metrics.connection().hget(metrics.WEBHOOK_DISABLED, cause) or 0)
