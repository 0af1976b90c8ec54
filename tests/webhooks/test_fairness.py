"""Whose deliveries a sweep claims (runs/engine/sql/webhook_claim.sql): an endpoint's
in-flight bound applied inside the claim, organizations served in turns, a suspended
organization's deliveries held; and the bound on what a test or a redelivery may add to
an endpoint's pending deliveries (webhooks.services)."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.utils import timezone

from billing.models import Organization
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
