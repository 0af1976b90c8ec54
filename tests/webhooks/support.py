"""Helpers of the webhook tests: endpoints, and a receiver's view of a delivery."""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

from billing.models import Organization
from tests.http_fixture import RecordedRequest
from webhooks import services
from webhooks.models import WebhookEndpoint

SECRET = "webhook-test-secret-0123456789"
ALL_EVENTS = ["run.completed", "run.failed", "run.cancelled", "run.waiting_approval"]


def endpoint(
    organization: Organization, url: str = "http://127.0.0.1:9/hook", **fields: Any
) -> WebhookEndpoint:
    fields.setdefault("events", [*ALL_EVENTS, "escalation.opened"])
    fields.setdefault("secret", SECRET)
    created, _ = services.endpoint_create(organization=organization, url=url, **fields)
    return created


def verify(secret: str, header: str, body: bytes, now: float, tolerance: int = 300) -> bool:
    """docs/webhooks.md's verification, as a receiver writes it."""
    parts = dict(item.split("=", 1) for item in header.split(","))
    signed = parts["t"].encode() + b"." + body
    expected = hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()
    fresh = abs(now - int(parts["t"])) <= tolerance
    return fresh and hmac.compare_digest(expected, parts["v1"])


def delivery_ids(requests: list[RecordedRequest]) -> list[str]:
    return [request.headers["x-orchestrator-delivery"] for request in requests]
