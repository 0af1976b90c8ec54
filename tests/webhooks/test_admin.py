"""Operators' webhook actions in the admin: each calls the service the API calls."""

from __future__ import annotations

import pytest
from django.test import Client

from tests import factories
from tests.webhooks.support import endpoint
from webhooks import services
from webhooks.models import WebhookDelivery, WebhookEndpoint

pytestmark = pytest.mark.django_db


def act(operator: Client, url: str, action: str, *pks: object) -> None:
    response = operator.post(url, {"action": action, "_selected_action": [str(pk) for pk in pks]})
    assert response.status_code == 302


def test_an_operator_disables_enables_and_pings_endpoints(operator: Client) -> None:
    hook = endpoint(factories.org())

    act(operator, "/admin/webhooks/webhookendpoint/", "disable_endpoints", hook.pk)
    assert not WebhookEndpoint.objects.get(pk=hook.pk).enabled
    act(operator, "/admin/webhooks/webhookendpoint/", "enable_endpoints", hook.pk)
    assert WebhookEndpoint.objects.get(pk=hook.pk).enabled
    act(operator, "/admin/webhooks/webhookendpoint/", "test_endpoints", hook.pk)
    assert WebhookDelivery.objects.get().event_type == "webhook.test"


def test_an_operator_sends_a_failed_delivery_again(operator: Client) -> None:
    hook = endpoint(factories.org())
    delivery = services.endpoint_test(endpoint_id=hook.pk)
    WebhookDelivery.objects.filter(pk=delivery.pk).update(status="failed")

    act(operator, "/admin/webhooks/webhookdelivery/", "redeliver", delivery.pk)

    assert WebhookDelivery.objects.get(pk=delivery.pk).status == "pending"
    page = operator.get(f"/admin/webhooks/webhookdelivery/{delivery.pk}/change/")
    assert page.status_code == 200
