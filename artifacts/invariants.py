"""Invariants of artifacts (ownership and unique keys, expiry once the run has ended),
checked by ``manage.py check_invariants`` with every other app's."""

from __future__ import annotations

from django.db.models import CharField, Count, F, Q, Value
from django.db.models.functions import Concat

from artifacts.models import LIVE, Artifact, ArtifactStatus
from artifacts.selectors import with_expiry
from common.invariants import LIMIT, invariant
from runs.states import RUN_TERMINAL


@invariant("artifacts.ownership", "an artifact belongs to its run's organization and step")
def artifact_ownership() -> list[str]:
    problems = [
        f"artifact {a.pk}: organization {a.organization_id} but its run's is "
        f"{a.run.organization_id}"
        for a in Artifact.objects.exclude(organization_id=F("run__organization_id"))
        .select_related("run")
        .only("organization_id", "run__organization_id")[:LIMIT]
    ]
    problems += [
        f"artifact {pk}: saved by a step of another run"
        for pk in Artifact.objects.filter(step__isnull=False)
        .exclude(step__run_id=F("run_id"))
        .values_list("pk", flat=True)[:LIMIT]
    ]
    # Keys are made, never taken from a client: <organization>/<run>/<uuid>.
    prefix = Concat(
        F("organization_id"), Value("/"), F("run_id"), Value("/"), output_field=CharField()
    )
    problems += [
        f"artifact {pk}: key {key!r} is not under its organization and run"
        for pk, key in Artifact.objects.annotate(prefix=prefix)
        .exclude(key__startswith=F("prefix"))
        .values_list("pk", "key")[:LIMIT]
    ]
    return problems


@invariant("artifacts.unique", "keys are unique, and names unique per run among live artifacts")
def artifact_unique() -> list[str]:
    keys = Artifact.objects.values("key").annotate(n=Count("*")).filter(n__gt=1).order_by()[:LIMIT]
    problems = [f"key {row['key']!r}: {row['n']} artifacts" for row in keys]
    names = (
        Artifact.objects.filter(status__in=LIVE)
        .values("run_id", "name")
        .annotate(n=Count("*"))
        .filter(n__gt=1)
        .order_by()[:LIMIT]
    )
    problems += [
        f"run {row['run_id']}: {row['n']} artifacts named {row['name']!r}" for row in names
    ]
    return problems


@invariant(
    "artifacts.expiry",
    "an available artifact of an ended run has an expiry; one still running has none; "
    "an available artifact is sized and hashed",
)
def artifact_expiry() -> list[str]:
    available = with_expiry(Artifact.objects.filter(status=ArtifactStatus.AVAILABLE))
    problems = [
        f"artifact {pk}: its run ended but it has no expiry"
        # Q: the annotation is not a field the type checker knows.
        for pk in available.filter(
            Q(run__status__in=RUN_TERMINAL), Q(expires_at__isnull=True)
        ).values_list("pk", flat=True)[:LIMIT]
    ]
    problems += [
        f"artifact {pk}: its run has not ended but it expires"
        for pk in available.exclude(run__status__in=RUN_TERMINAL)
        .filter(Q(expires_at__isnull=False))
        .values_list("pk", flat=True)[:LIMIT]
    ]
    problems += [
        f"artifact {pk}: available without a SHA-256 or a completion time"
        for pk in Artifact.objects.filter(status=ArtifactStatus.AVAILABLE)
        .filter(Q(completed_at__isnull=True) | ~Q(sha256__regex=r"^[0-9a-f]{64}$"))
        .values_list("pk", flat=True)[:LIMIT]
    ]
    problems += [
        f"artifact {pk}: deleted without a deletion time"
        for pk in Artifact.objects.filter(
            status=ArtifactStatus.DELETED, deleted_at__isnull=True
        ).values_list("pk", flat=True)[:LIMIT]
    ]
    return problems
