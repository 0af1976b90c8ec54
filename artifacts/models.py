"""Artifacts: files a run produces, kept in storage (the filesystem or S3) with expiry.

A row is the artifact's record; its bytes live in storage under ``key`` (never derived
from user input alone: ``<organization>/<run>/<uuid>``). Its life:

    uploading -> available -> deleting -> deleted
        \\______________________/

``uploading`` while bytes travel (a streamed upload, or a presigned one until
``complete``); ``deleting`` once chosen for deletion (expired, deleted by a client, an
abandoned upload) and until its object is gone from storage: marking first and deleting
second, then marking ``deleted``, means a crash between the two leaves a row the sweep
finishes, never an object nobody knows of.

When it expires is not stored as such: ``expires_at`` is null while the run has not
ended, then the later of ``run.completed_at + ARTIFACT_RETENTION_DAYS`` and
``extended_until`` (an upload after the run ended, a download: at least an hour ahead).
So a run's end needs no write here (``artifacts.selectors.with_expiry``).
"""

from __future__ import annotations

import uuid

from django.db import models
from django.db.models import Q

from billing.models import Organization
from runs.models import Run, Step


class ArtifactStatus(models.TextChoices):
    UPLOADING = "uploading"
    AVAILABLE = "available"
    DELETING = "deleting"
    DELETED = "deleted"


# Names are unique per run among the artifacts that are (or are becoming) there.
LIVE = (ArtifactStatus.UPLOADING, ArtifactStatus.AVAILABLE)


class Artifact(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    organization = models.ForeignKey(
        Organization, on_delete=models.CASCADE, related_name="artifacts"
    )
    # No index of its own: artifact_unique_name and artifact_run_created lead with it.
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="artifacts", db_index=False)
    # The step whose tool saved it (null: uploaded through the API).
    step = models.ForeignKey(
        Step, null=True, blank=True, on_delete=models.SET_NULL, related_name="+", db_index=False
    )
    name = models.CharField(max_length=255)
    key = models.CharField(max_length=300, unique=True)
    content_type = models.CharField(max_length=255, default="application/octet-stream")
    # Declared (a presigned upload) until the bytes are in; then what storage holds.
    size = models.BigIntegerField(default=0)
    sha256 = models.CharField(max_length=64, blank=True)
    status = models.CharField(
        max_length=10, choices=ArtifactStatus.choices, default=ArtifactStatus.UPLOADING
    )
    # An S3 multipart upload in progress (files above ARTIFACT_MULTIPART_THRESHOLD).
    upload_id = models.CharField(max_length=1024, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    completed_at = models.DateTimeField(null=True, blank=True)
    extended_until = models.DateTimeField(null=True, blank=True)
    last_downloaded_at = models.DateTimeField(null=True, blank=True)
    deleted_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["created_at"]
        indexes = [
            models.Index(fields=["run", "created_at"], name="artifact_run_created"),
            # What the sweep reads: rows still holding (or about to lose) an object.
            models.Index(
                fields=["status", "created_at"],
                name="artifact_live",
                condition=~Q(status="deleted"),
            ),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["run", "name"],
                name="artifact_unique_name",
                condition=Q(status__in=LIVE),
            ),
            models.CheckConstraint(
                condition=Q(status__in=ArtifactStatus.values), name="artifact_status_valid"
            ),
            models.CheckConstraint(condition=Q(size__gte=0), name="artifact_size_non_negative"),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.id})"


class OrganizationStorage(Organization):
    """An organization as the storage its artifacts hold (the admin's view)."""

    class Meta:
        proxy = True
        verbose_name = "organization storage"
        verbose_name_plural = "organization storage"
