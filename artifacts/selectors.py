"""Reading artifacts: a run's, one, their expiry, and the bytes they hold."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import (
    Case,
    DateTimeField,
    ExpressionWrapper,
    F,
    Q,
    QuerySet,
    Sum,
    Value,
    When,
)
from django.db.models.functions import Coalesce, Greatest

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


def run_bytes(run: Run) -> int:
    """What a run's artifacts hold (recorded for billing, not charged yet)."""
    live = Artifact.objects.filter(run=run, status__in=LIVE)
    return int(live.aggregate(total=Sum("size"))["total"] or 0)


def organization_bytes() -> dict[Any, int]:
    """Artifact bytes held per organization (the admin's storage column)."""
    rows = (
        Artifact.objects.filter(status__in=LIVE)
        .values("organization_id")
        .annotate(total=Sum("size"))
        .order_by()
    )
    return {row["organization_id"]: int(row["total"] or 0) for row in rows}
