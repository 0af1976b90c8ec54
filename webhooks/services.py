"""Run webhooks' writes (docs/webhooks.md): endpoints registered, changed, deleted and
pinged; deliveries claimed by the sender, their attempts recorded, re-sent by hand; a
sweep asked for after commit (``kick``).

Deliveries of run events are not written here: PostgreSQL writes them, by trigger, in the
transaction of the state change (migration 0001). The sender (``orchestrator.webhooks``)
claims what is due with ``deliveries_claim``, sends each outside any transaction and
records the answer with ``attempt_record``.
"""

from __future__ import annotations

import logging
import random
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

from celery import current_app
from django.conf import settings
from django.db import connection, transaction
from django.db.models import QuerySet
from django.utils import timezone

from billing import quotas
from billing.models import Organization
from billing.secrets import decrypt_value, encrypt_value
from common import metrics
from webhooks.models import (
    TEST_EVENT,
    URL_MAX_LENGTH,
    DeliveryStatus,
    EventType,
    WebhookAttempt,
    WebhookDelivery,
    WebhookEndpoint,
)

logger = logging.getLogger(__name__)

SECRET_PREFIX = "whsec_"  # noqa: S105 - a prefix, not a secret
SECRET_MIN_LENGTH = 16
SECRET_MAX_LENGTH = 200
ERROR_MAX_LENGTH = 500


# What an attempt changes of its endpoint.
ENDPOINT_STATE = [
    "enabled",
    "disabled_at",
    "disabled_reason",
    "consecutive_failures",
    "failing_since",
    "last_delivered_at",
    "updated_at",
]


class EndpointNotFound(Exception):
    """No endpoint of that id in the organization (the API answers 404)."""


class DeliveryNotFound(Exception):
    pass


class TooManyPendingDeliveries(Exception):
    """The endpoint has WEBHOOK_MAX_PENDING deliveries pending: a test delivery or a
    redelivery by hand is refused until some are sent (the API answers 429
    ``too_many_pending_deliveries`` with Retry-After). Deliveries of run events are never
    refused: they are written with the change they announce."""

    code = "too_many_pending_deliveries"
    retry_after = 10

    def __init__(self, limit: int) -> None:
        self.limit = limit
        super().__init__(
            f"the endpoint has {limit} deliveries pending, as many as it may; a test or a "
            "redelivery is refused until some are sent"
        )


class WebhookInvalid(Exception):
    """A field refused: ``field`` and a message (the API answers 400 invalid_request)."""

    def __init__(self, field: str, message: str) -> None:
        self.field, self.message = field, message
        super().__init__(f"{field}: {message}")


# --------------------------------------------------------------------------- pure rules
def url_problem(url: str) -> str | None:
    """Why ``url`` cannot be an endpoint, or None. Not resolved here: the outbound guard
    judges the address when a delivery is sent."""
    if len(url) > URL_MAX_LENGTH:
        return f"at most {URL_MAX_LENGTH} characters"
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises on a port out of range
    except ValueError:
        return "not a valid URL"
    if parts.scheme not in ("http", "https"):
        return "must be an http or https URL"
    if not parts.hostname:
        return "must name a host"
    if parts.username or parts.password:
        return "must not hold credentials (sign with the secret instead)"
    if any(ch.isspace() for ch in url):
        return "must not contain white space"
    return None


def events_problem(events: list[str]) -> str | None:
    if not events:
        return "at least one event type"
    unknown = [event for event in events if event not in EventType.values]
    if unknown:
        return f"unknown event type {unknown[0]!r}; one of {', '.join(EventType.values)}"
    return None


def retry_delay(attempt: int, *, base: float, cap: float, jitter: float) -> float:
    """Seconds to wait after failed attempt number ``attempt`` (1 for the first):
    ``base`` doubled each attempt up to ``cap``, times a jitter factor from 0.75 to 1.25
    (``jitter`` in [0, 1)), so that retries of many deliveries do not move in step."""
    exponent = min(max(attempt - 1, 0), 62)
    return min(base * 2.0**exponent, cap) * (0.75 + 0.5 * jitter)


def retry_deadline(delivery: WebhookDelivery) -> datetime:
    return delivery.retry_until or delivery.created_at + timedelta(
        seconds=settings.WEBHOOK_RETRY_WINDOW
    )


# --------------------------------------------------------------------------- endpoints
def _checked(url: str | None, events: list[str] | None, secret: str | None) -> None:
    if url is not None and (problem := url_problem(url)):
        raise WebhookInvalid("url", problem)
    if events is not None and (problem := events_problem(events)):
        raise WebhookInvalid("events", problem)
    if secret is not None and not SECRET_MIN_LENGTH <= len(secret) <= SECRET_MAX_LENGTH:
        raise WebhookInvalid(
            "secret", f"from {SECRET_MIN_LENGTH} to {SECRET_MAX_LENGTH} characters"
        )


def secret_generate() -> str:
    return SECRET_PREFIX + secrets.token_urlsafe(32)


def endpoint_secret(endpoint: WebhookEndpoint) -> str:
    """The signing secret, for the sender only (raises InvalidToken when no key fits)."""
    return decrypt_value(endpoint.secret_encrypted)


@transaction.atomic
def endpoint_create(
    *,
    organization: Organization,
    url: str,
    events: list[str],
    secret: str | None = None,
    description: str = "",
    actor: str = "",
) -> tuple[WebhookEndpoint, str]:
    """Register an endpoint; return it with its secret (generated when none is given),
    which is shown this once. Past the organization's quota: ``QuotaExceeded``."""
    _checked(url, events, secret)
    quotas.check_quota(
        organization, quotas.WEBHOOK_ENDPOINTS, held=endpoints_held(organization=organization)
    )
    secret = secret if secret is not None else secret_generate()
    endpoint = WebhookEndpoint.objects.create(
        organization=organization,
        url=url,
        events=sorted(set(events)),
        description=description,
        secret_encrypted=encrypt_value(secret),
        created_by=actor,
    )
    return endpoint, secret


def endpoints_held(*, organization: Organization) -> QuerySet[WebhookEndpoint]:
    """The endpoints that count against the quota `webhook_endpoints`: all of them,
    enabled or not (a disabled one is enabled again by a PATCH)."""
    return WebhookEndpoint.objects.filter(organization=organization)


def _endpoint_locked(endpoint_id: Any, organization: Organization | None) -> WebhookEndpoint:
    # NO KEY UPDATE: a run's transition inserting a delivery (a key-share lock on the
    # endpoint, for the foreign key) is not held up by it.
    rows = WebhookEndpoint.objects.select_for_update(no_key=True).filter(pk=endpoint_id)
    if organization is not None:
        rows = rows.filter(organization=organization)
    endpoint = rows.first()
    if endpoint is None:
        raise EndpointNotFound(str(endpoint_id))
    return endpoint


@transaction.atomic
def endpoint_update(
    *,
    endpoint_id: Any,
    organization: Organization | None = None,
    url: str | None = None,
    events: list[str] | None = None,
    secret: str | None = None,
    description: str | None = None,
    enabled: bool | None = None,
) -> WebhookEndpoint:
    """Change the fields given. Enabling a disabled endpoint forgets its failures; its
    pending deliveries are sent again. Disabling keeps them pending, unsent."""
    _checked(url, events, secret)
    endpoint = _endpoint_locked(endpoint_id, organization)
    if url is not None:
        endpoint.url = url
    if events is not None:
        endpoint.events = sorted(set(events))
    if secret is not None:
        endpoint.secret_encrypted = encrypt_value(secret)
    if description is not None:
        endpoint.description = description
    if enabled is True and not endpoint.enabled:
        _enable(endpoint)
    elif enabled is False and endpoint.enabled:
        _disable(endpoint, "disabled by its organization")
    endpoint.save()
    return endpoint


@transaction.atomic
def endpoint_delete(*, endpoint_id: Any, organization: Organization | None = None) -> None:
    """Delete the endpoint with its deliveries and their attempts."""
    _endpoint_locked(endpoint_id, organization).delete()


def _enable(endpoint: WebhookEndpoint) -> None:
    endpoint.enabled = True
    endpoint.disabled_at = None
    endpoint.disabled_reason = ""
    endpoint.consecutive_failures = 0
    endpoint.failing_since = None


def _disable(endpoint: WebhookEndpoint, reason: str, *, cause: str = "") -> None:
    """Disable the endpoint; ``cause``: a short name for the metrics of those the service
    disables by itself (``gone``, ``failing``, ``backlog``), counted once it commits."""
    endpoint.enabled = False
    endpoint.disabled_at = timezone.now()
    endpoint.disabled_reason = reason[:ERROR_MAX_LENGTH]
    if cause:
        transaction.on_commit(lambda: metrics.webhook_endpoint_disabled(cause))


def _backlog(endpoint: WebhookEndpoint) -> int | None:
    """How many deliveries the endpoint has pending when they are more than
    WEBHOOK_MAX_BACKLOG, else None. Counts no further than one past the bound (an index
    range of the pending deliveries, ``webhook_delivery_order``): a cost an attempt can
    pay."""
    limit = settings.WEBHOOK_MAX_BACKLOG
    pending = WebhookDelivery.objects.filter(endpoint=endpoint, status=DeliveryStatus.PENDING)
    counted = pending.values("id")[: limit + 1].count()
    return counted if counted > limit else None


def _room_for_one_more(endpoint: WebhookEndpoint) -> None:
    """Refuse a delivery by hand to an endpoint that has WEBHOOK_MAX_PENDING pending (a
    flood of tests or redeliveries would hold its place in every sweep for hours).
    Called with the endpoint locked: two requests cannot both take its last place."""
    limit = settings.WEBHOOK_MAX_PENDING
    pending = WebhookDelivery.objects.filter(endpoint=endpoint, status=DeliveryStatus.PENDING)
    if pending.values("id")[:limit].count() >= limit:  # counts no further than the limit
        raise TooManyPendingDeliveries(limit)


@transaction.atomic
def endpoint_test(*, endpoint_id: Any, organization: Organization | None = None) -> WebhookDelivery:
    """A `webhook.test` delivery to the endpoint (sent even while it is disabled, to
    check it before enabling it again); refused past WEBHOOK_MAX_PENDING pending."""
    endpoint = _endpoint_locked(endpoint_id, organization)
    _room_for_one_more(endpoint)
    now = timezone.now()
    return WebhookDelivery.objects.create(
        endpoint=endpoint,
        event_type=TEST_EVENT,
        payload={"endpoint": {"id": str(endpoint.pk), "url": endpoint.url}},
        next_attempt_at=now,
        created_at=now,
    )


# --------------------------------------------------------------------------- deliveries
def kick() -> None:
    """Ask for a sweep once the current transaction commits (not before: it would find
    nothing). Beat's sweep finds the delivery anyway; this only makes it prompt."""
    if settings.ORCHESTRATOR_DISPATCH_ENABLED:
        transaction.on_commit(_publish_sweep)


def _publish_sweep() -> None:
    try:
        expires = max(settings.WEBHOOK_SWEEP_INTERVAL, 5)
        # By name: this app, below the worker's, imports none of its tasks.
        current_app.send_task("orchestrator.webhooks.sweep", expires=expires, ignore_result=True)
    except Exception:  # a lost kick: beat's next sweep does the same
        logger.warning("webhooks: the sweep could not be asked for", exc_info=True)


@transaction.atomic
def delivery_redeliver(
    *, delivery_uid: Any, endpoint_id: Any | None = None, organization: Organization | None = None
) -> WebhookDelivery:
    """Send a delivery again, by hand, with the same id and body: due now, retried for a
    new window. A delivery being sent is sent again after its attempt. One that is no
    longer pending is refused past WEBHOOK_MAX_PENDING pending to its endpoint."""
    rows = WebhookDelivery.objects.select_for_update().filter(uid=delivery_uid)
    if endpoint_id is not None:
        rows = rows.filter(endpoint_id=endpoint_id)
    if organization is not None:
        rows = rows.filter(endpoint__organization=organization)
    delivery = rows.first()
    if delivery is None:
        raise DeliveryNotFound(str(delivery_uid))
    if delivery.status != DeliveryStatus.PENDING:
        # Locked after the delivery, as an attempt's record locks them.
        _room_for_one_more(_endpoint_locked(delivery.endpoint_id, None))
    now = timezone.now()
    delivery.status = DeliveryStatus.PENDING
    delivery.next_attempt_at = now
    delivery.retry_until = now + timedelta(seconds=settings.WEBHOOK_RETRY_WINDOW)
    delivery.save(update_fields=["status", "next_attempt_at", "retry_until"])
    return delivery


@dataclass(frozen=True)
class Claim:
    delivery_id: int
    token: str


def deliveries_claim(
    *, limit: int, per_endpoint: int, lease_seconds: float, per_organization: int | None = None
) -> list[Claim]:
    """Claim up to ``limit`` due deliveries, fairly (``webhooks.webhook_claim``,
    webhooks/sql/webhook_claim.sql): at most ``per_endpoint`` in flight to any endpoint
    and, across its endpoints, at most its quota `webhooks_in_flight` to any organization
    (its own, else ``per_organization``: by default QUOTA_WEBHOOKS_IN_FLIGHT; claimed
    ones whose lease runs count),
    organizations served in turns, a suspended organization's held. Each is held for
    ``lease_seconds``: a worker that dies while sending loses nothing, the delivery is due
    again when the lease ends.

    One sweep claims at a time (a transaction advisory lock; another sweep finding it
    taken returns nothing): the bounds count every claim made before it."""
    if per_organization is None:
        per_organization = settings.QUOTA_WEBHOOKS_IN_FLIGHT
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            "SELECT delivery_id, token"
            " FROM webhooks.webhook_claim(%s::int, %s::int, %s::int, %s::float8)",
            [limit, per_endpoint, per_organization, lease_seconds],
        )
        return [Claim(delivery_id, str(token)) for delivery_id, token in cursor.fetchall()]


def deliveries_in_flight(*, organization: Organization) -> QuerySet[WebhookDelivery]:
    """The organization's deliveries being sent now (claimed, their lease running): what
    its quota `webhooks_in_flight` bounds."""
    return WebhookDelivery.objects.filter(
        endpoint__organization=organization,
        status=DeliveryStatus.PENDING,
        lease_until__gte=timezone.now(),
    )


def deliveries_next_due() -> datetime | None:
    """The earliest moment a sweep finds a delivery to claim, or None: when beat sends the
    sweep next (orchestrator/periodic.py). A delivery held back only by its endpoint's
    concurrency counts as due: the attempt that holds the endpoint asks for a sweep when it
    is answered (``kick``), or its lease ends. A suspended organization's are not."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT webhooks.webhook_next_due()")
        due: datetime | None = cursor.fetchone()[0]
        return due


def delivery_claimed(*, delivery_id: int, token: str) -> WebhookDelivery | None:
    """The delivery if this claim still holds it (pending, same token), else None: a
    message received twice, or after its lease passed to another claim, sends nothing."""
    return (
        WebhookDelivery.objects.select_related("endpoint")
        .filter(pk=delivery_id, lease_token=token, status=DeliveryStatus.PENDING)
        .first()
    )


@dataclass(frozen=True)
class AttemptResult:
    status_code: int | None
    error: str
    duration_ms: int

    @property
    def ok(self) -> bool:
        return not self.error and self.status_code is not None and 200 <= self.status_code < 300


@transaction.atomic
def attempt_record(*, delivery_id: int, token: str, result: AttemptResult) -> str | None:
    """Record one attempt and what follows: delivered; failed for good (410 Gone disables
    the endpoint at once; the retry window passed); or due again after the backoff. The
    endpoint's failures in a row are counted, and past both WEBHOOK_DISABLE_AFTER seconds
    and WEBHOOK_DISABLE_FAILURES attempts it is disabled; so is an endpoint left with more
    than WEBHOOK_MAX_BACKLOG deliveries pending, whatever the answer. Returns the
    delivery's status, or None when the claim was lost (nothing changes but the attempt's
    record)."""
    delivery = WebhookDelivery.objects.select_for_update().filter(pk=delivery_id).first()
    if delivery is None:
        return None  # deleted with its endpoint meanwhile
    endpoint = WebhookEndpoint.objects.select_for_update(no_key=True).get(pk=delivery.endpoint_id)
    now = timezone.now()
    delivery.attempts += 1
    WebhookAttempt.objects.create(
        delivery=delivery,
        number=delivery.attempts,
        status_code=result.status_code,
        ok=result.ok,
        error=result.error[:ERROR_MAX_LENGTH],
        duration_ms=result.duration_ms,
    )
    fields = ["attempts"]
    if str(delivery.lease_token) != token or delivery.status != DeliveryStatus.PENDING:
        delivery.save(update_fields=fields)
        return None
    delivery.last_status_code = result.status_code
    delivery.last_error = result.error[:ERROR_MAX_LENGTH]
    delivery.lease_until = None
    delivery.lease_token = None
    fields += ["last_status_code", "last_error", "lease_until", "lease_token", "status"]
    if result.ok:
        delivery.status = DeliveryStatus.DELIVERED
        delivery.delivered_at = now
        fields.append("delivered_at")
        endpoint.consecutive_failures = 0
        endpoint.failing_since = None
        endpoint.last_delivered_at = now
    else:
        endpoint.consecutive_failures += 1
        endpoint.failing_since = endpoint.failing_since or now
        if result.status_code == 410:
            delivery.status = DeliveryStatus.FAILED
            if endpoint.enabled:
                _disable(endpoint, "the endpoint answered 410 Gone", cause="gone")
        elif now >= retry_deadline(delivery):
            delivery.status = DeliveryStatus.FAILED
        else:
            delay = retry_delay(
                delivery.attempts,
                base=settings.WEBHOOK_BACKOFF,
                cap=settings.WEBHOOK_BACKOFF_MAX,
                jitter=random.random(),  # noqa: S311 - spreading retries, not a secret
            )
            delivery.next_attempt_at = min(now + timedelta(seconds=delay), retry_deadline(delivery))
            fields.append("next_attempt_at")
        failing_for = (now - endpoint.failing_since).total_seconds()
        if (
            endpoint.enabled
            and endpoint.consecutive_failures >= settings.WEBHOOK_DISABLE_FAILURES
            and failing_for >= settings.WEBHOOK_DISABLE_AFTER
        ):
            _disable(
                endpoint,
                f"failed {endpoint.consecutive_failures} attempts in a row over "
                f"{int(failing_for)} s; last: {result.error or result.status_code}",
                cause="failing",
            )
    delivery.save(update_fields=fields)
    if endpoint.enabled and (backlog := _backlog(endpoint)) is not None:
        # Its receiver takes fewer than its runs announce: run events are never refused
        # (they are written with the change they announce), so the endpoint stops
        # getting new ones instead, and keeps those it has, to be sent once it is
        # enabled again (docs/webhooks.md, "Disabling").
        _disable(
            endpoint,
            f"more than {settings.WEBHOOK_MAX_BACKLOG} deliveries pending "
            f"(WEBHOOK_MAX_BACKLOG; {backlog} counted): its receiver does not keep up; "
            "enable it again to send them",
            cause="backlog",
        )
    endpoint.save(update_fields=ENDPOINT_STATE)
    return str(delivery.status)
