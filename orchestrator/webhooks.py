"""Sending run webhooks (docs/webhooks.md): the sweep that claims due deliveries, and the
signed POST of one delivery through the outbound address guard.

PostgreSQL writes a delivery in the transaction of the state change it announces
(webhooks/migrations/0001); this module only sends. The sweep, which beat sends once a
delivery is due (``webhooks.services.deliveries_next_due``, looked for every
WEBHOOK_SWEEP_INTERVAL s), claims what is due (``webhooks.services.deliveries_claim``:
FOR UPDATE SKIP LOCKED, at most WEBHOOK_ENDPOINT_CONCURRENCY in flight per endpoint and
an organization's quota `webhooks_in_flight` per organization, organizations in turns,
each under a lease) and publishes one
``orchestrator.webhooks.deliver`` message per claim, on the ``webhooks`` queue
(config/celery.py), which only the `webhooks` process consumes (Procfile: a pool of
threads), apart from the workers that run steps. A delivery
created from Python (a test ping, a redelivery) and a delivery just answered ask for a
sweep after commit instead of waiting for beat (``webhooks.services.kick``).

The request mirrors the on-call webhook (orchestrator/notify.py): the same
``signature()`` over ``"<t>.<body>"`` in ``X-Orchestrator-Signature``,
``X-Orchestrator-Event`` and ``X-Orchestrator-Delivery`` (here the delivery's id, the
same on every attempt, as is the body's ``id``).
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import httpx
from cryptography.fernet import InvalidToken
from django.conf import settings

from common import metrics
from config.celery import app
from orchestrator import outbound
from orchestrator.netguard import WEBHOOK, AddressNotAllowed
from orchestrator.notify import SIGNATURE_HEADER, signature
from webhooks import services
from webhooks.models import WebhookDelivery

logger = logging.getLogger(__name__)

# What an attempt cut at WEBHOOK_TIMEOUT records as its error's first word.
TIMEOUT = "timeout"


def body(delivery: WebhookDelivery) -> dict[str, Any]:
    """What a delivery says: the same on every attempt (its ``id`` for de-duplication)."""
    base = settings.PUBLIC_BASE_URL
    content: dict[str, Any] = {
        "id": str(delivery.uid),
        "type": delivery.event_type,
        "created_at": delivery.created_at.isoformat(),
        "organization": str(delivery.endpoint.organization_id),
        **delivery.payload,
    }
    links = {}
    if delivery.run_id is not None:
        links["run"] = f"{base}/api/v1/runs/{delivery.run_id}"
    escalation = delivery.payload.get("escalation")
    if isinstance(escalation, dict) and "id" in escalation:
        links["escalation"] = f"{base}/api/v1/escalations/{escalation['id']}"
    if links:
        content["links"] = links
    return content


def encoded(delivery: WebhookDelivery) -> bytes:
    return json.dumps(body(delivery), separators=(",", ":"), sort_keys=True).encode()


def sweep() -> dict[str, int]:
    """Claim the due deliveries and publish a message for each (after the claim
    commits). A message lost, or a worker dead while sending: the lease ends and a later
    sweep claims the delivery again."""
    claims = services.deliveries_claim(
        limit=settings.WEBHOOK_SWEEP_BATCH,
        per_endpoint=settings.WEBHOOK_ENDPOINT_CONCURRENCY,
        lease_seconds=settings.WEBHOOK_LEASE,
    )
    for claim in claims:
        # By name: orchestrator.tasks imports this module, never the reverse.
        app.send_task(
            "orchestrator.webhooks.deliver",
            args=(claim.delivery_id, claim.token),
            expires=settings.WEBHOOK_LEASE,
            ignore_result=True,
        )
    return {"claimed": len(claims)}


def deliver(delivery_id: int, token: str) -> str | None:
    """Send one claimed delivery and record the attempt; the delivery's status after it,
    or None when the claim no longer holds (a duplicate message: nothing sent)."""
    delivery = services.delivery_claimed(delivery_id=delivery_id, token=token)
    if delivery is None:
        return None
    result = post(delivery)
    status = services.attempt_record(delivery_id=delivery_id, token=token, result=result)
    if status is not None:
        metrics.webhook_attempt(status)  # recorded and committed: counted once
        services.kick()  # the run's next delivery to this endpoint may wait for this one
    return status


def post(delivery: WebhookDelivery) -> services.AttemptResult:
    """One signed POST: its status code, an error ("" when 2xx) and its duration. The
    whole exchange (the name's look-up, connect, TLS, the request, the answer's headers
    and body) is bounded by WEBHOOK_TIMEOUT in all (the guard's deadline): a receiver
    that drips its answer is cut like a silent one, and the attempt is recorded as a
    ``timeout``, well within the claim's lease. At most WEBHOOK_MAX_RESPONSE_BYTES of the
    answer are read, counted decoded (``orchestrator.outbound``: a gzip bomb stops
    there), and its excerpt is stored without NUL characters."""
    content = encoded(delivery)
    started = time.monotonic()
    status: int | None = None
    error = ""
    try:
        secret = services.endpoint_secret(delivery.endpoint)
        headers = {
            "Content-Type": "application/json",
            "User-Agent": "run-orchestrator",
            "X-Orchestrator-Event": delivery.event_type,
            "X-Orchestrator-Delivery": str(delivery.uid),
            SIGNATURE_HEADER: signature(secret, int(time.time()), content),
        }
        with outbound.exchange(
            "POST",
            delivery.endpoint.url,
            deadline=started + float(settings.WEBHOOK_TIMEOUT),
            refused=WEBHOOK,
            content=content,
            headers=headers,
        ) as answer:
            status = answer.status_code
            excerpt = outbound.excerpt(answer, int(settings.WEBHOOK_MAX_RESPONSE_BYTES))
        if not 200 <= status < 300:
            error = f"HTTP {status}: {excerpt}"
    except httpx.TimeoutException:
        status = None  # an answer cut short is no answer
        error = (
            f"{TIMEOUT}: no whole answer within WEBHOOK_TIMEOUT ({settings.WEBHOOK_TIMEOUT:g} s)"
        )
    except AddressNotAllowed as exc:
        error = str(exc)
    except InvalidToken:
        error = "the endpoint's secret cannot be decrypted with any key of SECRETS_ENCRYPTION_KEYS"
    except (httpx.HTTPError, OSError) as exc:  # recorded and retried, never raised
        error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    duration_ms = int((time.monotonic() - started) * 1000)
    return services.AttemptResult(status_code=status, error=error, duration_ms=duration_ms)
