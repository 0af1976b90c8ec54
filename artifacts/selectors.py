"""Reading artifacts: a run's, one, their expiry, and the bytes they hold."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db.models import (
    Case,
    DateTimeField,
    DecimalField,
    DurationField,
    ExpressionWrapper,
    F,
    Q,
    QuerySet,
    Sum,
    Value,
    When,
)
from django.db.models.functions import Coalesce, Extract, Greatest
from django.utils import timezone

from artifacts.models import LIVE, Artifact, ArtifactStatus
from billing.models import Organization
from runs.models import Run
from runs.services import RunNotFound
from runs.states import RUN_TERMINAL


class ArtifactNotFound(Exception):
    code = "not_found"


def with_expiry(artifacts: QuerySet[Artifact]) -> QuerySet[Artifact]:
    """``expires_at``: null while the run has not ended, then the later of its end plus
    ARTIFACT_RETENTION_DAYS and the artifact's own extension (models.py)."""
    retention = timedelta(days=settings.ARTIFACT_RETENTION_DAYS)
    kept_until = ExpressionWrapper(
        F("run__completed_at") + Value(retention), output_field=DateTimeField()
    )
    return artifacts.annotate(
        expires_at=Case(
            When(
                run__status__in=RUN_TERMINAL,
                run__completed_at__isnull=False,
                then=Greatest(kept_until, Coalesce(F("extended_until"), kept_until)),
            ),
            default=None,
            output_field=DateTimeField(),
        )
    )


def artifacts_held(
    *, organization: Organization, now: datetime | None = None
) -> QuerySet[Artifact]:
    """What counts against the organization's artifact quotas (``artifacts``,
    ``artifact_bytes``): its artifacts stored or being uploaded, but not those deleted
    (or being deleted) nor past their expiry (the next sweep deletes them)."""
    live = with_expiry(Artifact.objects.filter(organization=organization, status__in=LIVE))
    # Spelled out, not exclude(expires_at__lte=now): NOT (NULL <= now) is NULL, which
    # would drop every artifact of a run not ended.
    unexpired = Q(expires_at__isnull=True) | Q(expires_at__gt=now or timezone.now())
    return live.filter(Q(status=ArtifactStatus.UPLOADING) | unexpired)


def expired_artifacts(now: datetime) -> QuerySet[Artifact]:
    # Q: the annotation is not a field the type checker knows.
    available = Artifact.objects.filter(status=ArtifactStatus.AVAILABLE)
    return with_expiry(available).filter(Q(expires_at__lte=now))


def run_of(*, organization: Organization, run_id: Any) -> None:
    """RunNotFound (404) unless ``run_id`` is one of ``organization``'s runs."""
    if not Run.objects.filter(pk=run_id, organization=organization).exists():
        raise RunNotFound("not found")


def artifact_list(*, organization: Organization, run_id: Any) -> QuerySet[Artifact]:
    """A run's artifacts (uploading or available), oldest first; 404 for another
    organization's run."""
    run_of(organization=organization, run_id=run_id)
    return with_expiry(
        Artifact.objects.filter(run_id=run_id, status__in=LIVE).order_by("created_at", "id")
    )


def artifact_get(*, organization: Organization, artifact_id: Any) -> Artifact:
    found = with_expiry(
        Artifact.objects.filter(organization=organization, pk=artifact_id, status__in=LIVE)
    ).first()
    if found is None:
        raise ArtifactNotFound("not found")
    return found


@dataclass(frozen=True)
class StorageUsage:
    """What artifacts hold, for billing (not charged yet): the bytes held now, and the
    byte-hours held so far, each artifact from its upload's completion until its object
    was deleted (or ``until``). Rows are never removed once their bytes were stored:
    marked ``deleted`` with ``deleted_at``, they stay the record of what was held."""

    bytes_held: int
    byte_hours: Decimal


def _usage_sums(until: datetime) -> dict[str, Any]:
    """The aggregates of ``StorageUsage`` over artifacts whose upload completed."""
    held_for = ExpressionWrapper(
        Coalesce(F("deleted_at"), Value(until)) - F("completed_at"),
        output_field=DurationField(),
    )
    stored = Q(completed_at__isnull=False, completed_at__lte=until)
    return {
        "held": Sum("size", filter=Q(status__in=LIVE)),
        "byte_seconds": Sum(
            F("size") * Extract(held_for, "epoch"), filter=stored, output_field=DecimalField()
        ),
    }


def _as_usage(row: Mapping[str, Any]) -> StorageUsage:
    byte_seconds = Decimal(row["byte_seconds"] or 0)
    return StorageUsage(
        bytes_held=int(row["held"] or 0),
        byte_hours=(byte_seconds / 3600).quantize(Decimal("0.001")),
    )


def run_storage(run: Run, *, until: datetime | None = None) -> StorageUsage:
    """A run's artifact storage (see ``StorageUsage``)."""
    sums = _usage_sums(until or timezone.now())
    return _as_usage(Artifact.objects.filter(run=run).aggregate(**sums))


def organization_storage(*, until: datetime | None = None) -> dict[Any, StorageUsage]:
    """Artifact storage per organization (the admin's storage columns)."""
    sums = _usage_sums(until or timezone.now())
    rows = Artifact.objects.values("organization_id").annotate(**sums).order_by()
    return {row["organization_id"]: _as_usage(row) for row in rows}
