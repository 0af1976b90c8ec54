"""Run webhooks (docs/webhooks.md): the endpoints an organization registers, one delivery
per event and endpoint, and a record of every attempt to send it.

A ``WebhookDelivery`` is written by PostgreSQL itself, by triggers on the runs' and the
escalation tickets' tables (migration 0001), in the transaction that changes the run's
status or opens the ticket: a state change that commits has its deliveries, one that rolls
back has none, whatever code path made it (the Python transitions, the engine's SQL hot
path). ``uid`` is the delivery's public id, the same on every attempt, for receivers that
de-duplicate; ``id`` orders deliveries (a run's are sent to an endpoint in that order).
"""

from __future__ import annotations

import uuid

from django.contrib.postgres.fields import ArrayField
from django.contrib.postgres.functions import RandomUUID
from django.db import models
from django.db.models import Q

from billing.models import Organization
from runs.models import Run

URL_MAX_LENGTH = 2000
DESCRIPTION_MAX_LENGTH = 200


class EventType(models.TextChoices):
    RUN_COMPLETED = "run.completed"
    RUN_FAILED = "run.failed"
    RUN_CANCELLED = "run.cancelled"
    RUN_WAITING_APPROVAL = "run.waiting_approval"
    ESCALATION_OPENED = "escalation.opened"


# A ping sent by hand (POST /webhooks/{id}/test), never subscribed to.
TEST_EVENT = "webhook.test"


class DeliveryStatus(models.TextChoices):
    PENDING = "pending"  # not yet delivered: due at next_attempt_at, or being sent
    DELIVERED = "delivered"
    FAILED = "failed"  # given up: the retry window passed, or the endpoint answered 410


class WebhookEndpoint(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    organization = models.ForeignKey(
        Organization, on_delete=models.CASCADE, related_name="webhook_endpoints"
    )
    url = models.CharField(max_length=URL_MAX_LENGTH)
    events = ArrayField(models.CharField(max_length=40, choices=EventType.choices))
    description = models.CharField(max_length=DESCRIPTION_MAX_LENGTH, blank=True)
    # The signing secret as a Fernet token (billing.secrets): shown once, never again.
    secret_encrypted = models.BinaryField()
    enabled = models.BooleanField(default=True)
    # Why and when it was disabled: by its owner (PATCH enabled=false), by a 410 Gone
    # answer, or by failing for WEBHOOK_DISABLE_AFTER seconds and
    # WEBHOOK_DISABLE_FAILURES attempts in a row.
    disabled_at = models.DateTimeField(null=True, blank=True)
    disabled_reason = models.CharField(max_length=500, blank=True)
    # Attempts failed since the last delivered one, and when the first of them was made.
    consecutive_failures = models.PositiveIntegerField(default=0)
    failing_since = models.DateTimeField(null=True, blank=True)
    last_delivered_at = models.DateTimeField(null=True, blank=True)
    created_by = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            models.Index(fields=["organization", "-created_at"], name="webhook_endpoint_org"),
        ]

    def __str__(self) -> str:
        return f"{self.url} ({self.id})"


class WebhookDelivery(models.Model):
    id = models.BigAutoField(primary_key=True)
    uid = models.UUIDField(unique=True, default=uuid.uuid4, db_default=RandomUUID())
    endpoint = models.ForeignKey(
        WebhookEndpoint, on_delete=models.CASCADE, related_name="deliveries"
    )
    # Null for a test ping; the run stays referenced by id only when it is deleted.
    run = models.ForeignKey(
        Run, null=True, blank=True, on_delete=models.SET_NULL, related_name="+", db_index=False
    )
    event_type = models.CharField(max_length=40)
    # What the body says of the run (and the ticket) as they were at the event.
    payload = models.JSONField(default=dict)
    status = models.CharField(
        max_length=10, choices=DeliveryStatus.choices, default=DeliveryStatus.PENDING
    )
    attempts = models.PositiveIntegerField(default=0, db_default=0)
    next_attempt_at = models.DateTimeField()
    # A sender holds a claimed delivery until lease_until; past it, the delivery is due
    # again (its worker died): lease_token tells the holder's result from a later one's.
    lease_until = models.DateTimeField(null=True, blank=True)
    lease_token = models.UUIDField(null=True, blank=True)
    last_status_code = models.PositiveIntegerField(null=True, blank=True)
    last_error = models.CharField(max_length=500, blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField()
    # Retried until then (null: WEBHOOK_RETRY_WINDOW after created_at); a redelivery by
    # hand opens a new window.
    retry_until = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name_plural = "webhook deliveries"
        ordering = ["-id"]
        indexes = [
            models.Index(fields=["endpoint", "-id"], name="webhook_delivery_endpoint"),
            # What the sweep reads: the pending deliveries, by due time.
            models.Index(
                fields=["next_attempt_at"],
                name="webhook_delivery_due",
                condition=Q(status="pending"),
            ),
            models.Index(
                fields=["endpoint", "run", "id"],
                name="webhook_delivery_order",
                condition=Q(status="pending"),
            ),
        ]
        constraints = [
            models.CheckConstraint(
                condition=Q(status__in=DeliveryStatus.values), name="webhook_delivery_status"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.event_type} {self.uid} ({self.status})"


class WebhookAttempt(models.Model):
    """One POST of a delivery: its answer's status code (none when it never came) and
    how long it took."""

    id = models.BigAutoField(primary_key=True)
    delivery = models.ForeignKey(
        WebhookDelivery, on_delete=models.CASCADE, related_name="attempt_records"
    )
    number = models.PositiveIntegerField()
    status_code = models.PositiveIntegerField(null=True, blank=True)
    ok = models.BooleanField()
    error = models.CharField(max_length=500, blank=True)
    duration_ms = models.PositiveIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["delivery", "number"]
        indexes = [models.Index(fields=["delivery", "number"], name="webhook_attempt_order")]

    def __str__(self) -> str:
        return f"attempt {self.number} of {self.delivery_id}"
