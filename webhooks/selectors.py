"""Run webhooks' reads: an organization's endpoints, an endpoint's deliveries with
their attempts."""

from __future__ import annotations

from typing import Any

from django.db.models import Prefetch, QuerySet

from billing.models import Organization
from webhooks.models import WebhookAttempt, WebhookDelivery, WebhookEndpoint
from webhooks.services import EndpointNotFound


def endpoint_list(*, organization: Organization) -> QuerySet[WebhookEndpoint]:
    return WebhookEndpoint.objects.filter(organization=organization).order_by("-created_at", "id")


def endpoint_get(*, organization: Organization, endpoint_id: Any) -> WebhookEndpoint:
    endpoint = WebhookEndpoint.objects.filter(organization=organization, pk=endpoint_id).first()
    if endpoint is None:
        raise EndpointNotFound(str(endpoint_id))
    return endpoint


def delivery_list(*, endpoint: WebhookEndpoint) -> QuerySet[WebhookDelivery]:
    """The endpoint's deliveries, newest first, each with its attempts in order."""
    return (
        WebhookDelivery.objects.filter(endpoint=endpoint)
        .prefetch_related(
            Prefetch("attempt_records", queryset=WebhookAttempt.objects.order_by("number"))
        )
        .order_by("-id")
    )
