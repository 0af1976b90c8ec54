"""What the API keeps for itself: stored responses of `Idempotency-Key` requests."""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from billing.models import Organization


class IdempotencyStatus(models.TextChoices):
    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"


class IdempotencyRecord(models.Model):
    """One `Idempotency-Key` of one organization on one endpoint (method and path).

    The unique constraint decides which of several concurrent requests owns the key
    (``api.idempotency``). An ``in_progress`` row is a claim: the request that
    inserted it is running. A ``completed`` row holds the response to replay. Past
    ``expires_at`` a row counts as absent; a beat sweep deletes such rows.
    """

    id = models.BigAutoField(primary_key=True)
    organization = models.ForeignKey(
        Organization, on_delete=models.CASCADE, related_name="idempotency_records"
    )
    method = models.CharField(max_length=10)
    path = models.CharField(max_length=500)
    key = models.CharField(max_length=255)
    # HMAC-SHA256, keyed from SECRET_KEY, of the request body as canonical JSON (sorted
    # keys, no whitespace): api.idempotency.fingerprint.
    fingerprint = models.CharField(max_length=64)
    status = models.CharField(
        max_length=12, choices=IdempotencyStatus.choices, default=IdempotencyStatus.IN_PROGRESS
    )
    response_status = models.PositiveSmallIntegerField(null=True, blank=True)
    response_body = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["organization", "method", "path", "key"], name="idempotency_unique_key"
            ),
            models.CheckConstraint(
                condition=Q(status__in=IdempotencyStatus.values), name="idempotency_status_valid"
            ),
            models.CheckConstraint(
                condition=Q(status=IdempotencyStatus.IN_PROGRESS)
                | Q(response_status__isnull=False),
                name="idempotency_completed_has_response",
            ),
        ]
        indexes = [models.Index(fields=["expires_at"], name="idempotency_expires")]

    def __str__(self) -> str:
        return f"{self.method} {self.path} [{self.key}] {self.status}"
