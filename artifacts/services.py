"""Every change to artifacts, one function per operation (docs/artifacts.md).

Uploading is three moves, so that the database never claims bytes storage does not
hold, and storage never holds bytes the database does not know of:

1. reserve, in one short transaction under the run's lock: the run may take the file
   (not deleted, the name free, fewer than ARTIFACT_MAX_IN_FLIGHT uploads in flight,
   ARTIFACT_RUN_MAX_BYTES not exceeded), and so may its organization (its quotas of
   artifacts and of their bytes, under their locks: ``billing.quotas``), and an
   ``uploading`` row is written;
2. the bytes go to storage, outside any transaction, hashed on the way;
3. the row becomes ``available`` with the size and SHA-256 storage holds.

A storage failure at 2 removes the row again (its object, if any, is deleted; if that
fails too, the row stays as ``deleting`` for the sweep, invisible to clients), and the
caller answers 503: nothing half-recorded. Deleting marks first and deletes second, so a
crash in between leaves a row the sweep finishes.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, BinaryIO

from django.conf import settings
from django.db import transaction
from django.db.models import Sum
from django.utils import timezone

from artifacts.models import LIVE, Artifact, ArtifactStatus
from artifacts.selectors import ArtifactNotFound, artifacts_held, expired_artifacts
from artifacts.storage import StorageUnavailable, Stored, UploadTarget, backend
from billing import quotas
from billing.models import Organization
from billing.quotas import QuotaExceeded
from common.text import text_problem
from runs.models import Run
from runs.services import RunDeleted, lock_run
from runs.states import RUN_TERMINAL
from runs.waits.runners import held_job

A = ArtifactStatus
# What an upload after the run ended, or a download, keeps an artifact for at least.
GRACE = timedelta(hours=1)


class ArtifactExists(Exception):
    code = "artifact_exists"


class TooManyUploads(Exception):
    code = "too_many_uploads"
    retry_after = 5


class RunStorageFull(Exception):
    code = "run_storage_full"


class ArtifactTooLarge(Exception):
    code = "artifact_too_large"


class UploadMismatch(Exception):
    """What storage holds is not what the upload said it would be (or nothing yet)."""

    code = "upload_mismatch"


class ArtifactNotReady(Exception):
    """Its upload has not completed."""

    code = "artifact_not_ready"


class InvalidName(ValueError):
    code = "invalid_request"


def check_name(name: str) -> str:
    name = name.strip()
    problem = text_problem(name)
    if not name or len(name) > 255 or problem:
        raise InvalidName(problem or "a name is 1 to 255 characters")
    return name


# --------------------------------------------------------------------------- reserving
def _reserve(
    organization: Organization,
    run_id: Any,
    name: str,
    size: int,
    content_type: str,
    *,
    step_id: int | None = None,
    sha256: str = "",
) -> Artifact:
    name = check_name(name)
    if size > settings.ARTIFACT_MAX_FILE_BYTES:
        raise ArtifactTooLarge(
            f"{size} bytes; an artifact may have at most {settings.ARTIFACT_MAX_FILE_BYTES}"
        )
    with transaction.atomic():
        # The run's lock serialises the counting: two uploads cannot both take the last
        # slot or the last bytes.
        run = lock_run(run_id, organization, light=True)
        if run.deleted_at is not None:
            raise RunDeleted(f"run {run.pk} was deleted")
        live = Artifact.objects.filter(run=run, status__in=LIVE)
        if live.filter(name=name).exists():
            raise ArtifactExists(f"run {run.pk} already has an artifact named {name!r}")
        in_flight = live.filter(status=A.UPLOADING).count()
        if in_flight >= settings.ARTIFACT_MAX_IN_FLIGHT:
            raise TooManyUploads(
                f"run {run.pk} has {in_flight} uploads in flight; at most "
                f"{settings.ARTIFACT_MAX_IN_FLIGHT}"
            )
        used = live.aggregate(total=Sum("size"))["total"] or 0
        if used + size > settings.ARTIFACT_RUN_MAX_BYTES:
            raise RunStorageFull(
                f"run {run.pk} holds {used} bytes of artifacts; {size} more would exceed "
                f"{settings.ARTIFACT_RUN_MAX_BYTES}"
            )
        # Across the organization's runs: each quota counted under its own lock, taken
        # after the run's (always in this order), so two uploads to two runs cannot both
        # take its last place or bytes.
        held = artifacts_held(organization=organization)
        quotas.check_quota(organization, quotas.ARTIFACTS, held=held)
        quotas.check_quota(organization, quotas.ARTIFACT_BYTES, held=held, adding=size)
        return Artifact.objects.create(
            organization=organization,
            run=run,
            step_id=step_id,
            name=name,
            key=f"{organization.pk}/{run.pk}/{uuid.uuid4().hex}",
            content_type=content_type or "application/octet-stream",
            size=size,
            sha256=sha256,
            status=A.UPLOADING,
        )


def _available(artifact: Artifact, stored: Stored) -> Artifact:
    """The bytes are in: the artifact becomes visible, sized and hashed as stored."""
    with transaction.atomic():
        row = Artifact.objects.select_for_update().get(pk=artifact.pk)
        run = Run.objects.only("status", "completed_at").get(pk=row.run_id)
        now = timezone.now()
        row.size, row.sha256 = stored.size, stored.sha256
        row.status, row.completed_at, row.upload_id = A.AVAILABLE, now, ""
        if run.status in RUN_TERMINAL:
            row.extended_until = now + GRACE  # uploaded after the run ended
        row.save(
            update_fields=[
                "size",
                "sha256",
                "status",
                "completed_at",
                "upload_id",
                "extended_until",
            ]
        )
        return row


def _abandon(artifact: Artifact) -> None:
    """An upload failed: remove what it left, or leave it to the sweep when storage
    cannot be reached now (the row, ``deleting``, is invisible to clients)."""
    Artifact.objects.filter(pk=artifact.pk).update(status=A.DELETING)
    try:
        _delete_object(artifact)
    except StorageUnavailable:
        return
    Artifact.objects.filter(pk=artifact.pk).delete()


def _delete_object(artifact: Artifact) -> None:
    store = backend()
    if artifact.upload_id:
        store.abort_multipart(artifact.key, artifact.upload_id)
    store.delete(artifact.key)


# --------------------------------------------------------------------------- uploading
def upload(
    *,
    organization: Organization,
    run_id: Any,
    name: str,
    stream: BinaryIO,
    size: int,
    content_type: str = "",
    step_id: int | None = None,
) -> Artifact:
    """Store ``stream`` (``size`` bytes) as the run's artifact ``name``."""
    artifact = _reserve(organization, run_id, name, size, content_type, step_id=step_id)
    try:
        stored = backend().save(artifact.key, stream, artifact.content_type)
    except BaseException:
        _abandon(artifact)
        raise
    return _available(artifact, stored)


def job_upload(
    *,
    organization: Organization,
    runner_id: str,
    job_id: Any,
    name: str,
    stream: BinaryIO,
    size: int,
    content_type: str = "",
) -> Artifact:
    """Store ``stream`` as an artifact of the step whose job ``runner_id`` holds (a
    worker tool's ``Context.upload``), as the fleet's executor saves a tool's: the
    artifact names the step, in the job's run. A runner that does not hold the job is
    refused before anything is stored (``runs.waits.runners.held_job``)."""
    job = held_job(organization=organization, runner_id=runner_id, job_id=job_id)
    return upload(
        organization=organization,
        run_id=job.run_id,
        name=name,
        stream=stream,
        size=size,
        content_type=content_type,
        step_id=job.step_id,
    )


@dataclass(frozen=True)
class Upload:
    artifact: Artifact
    # None: send the bytes to the API (PUT /api/v1/artifacts/{id}/content).
    target: UploadTarget | None


def start_upload(
    *,
    organization: Organization,
    run_id: Any,
    name: str,
    size: int,
    content_type: str = "",
    sha256: str = "",
) -> Upload:
    """Reserve a large upload and say where its bytes go (a presigned PUT, or part URLs
    above ARTIFACT_MULTIPART_THRESHOLD); ``complete_upload`` makes it visible."""
    artifact = _reserve(organization, run_id, name, size, content_type, sha256=sha256.lower())
    try:
        target = backend().upload_target(artifact.key, size, artifact.content_type)
    except BaseException:
        _abandon(artifact)
        raise
    if target is not None and target.upload_id:
        artifact.upload_id = target.upload_id
        artifact.save(update_fields=["upload_id"])
    return Upload(artifact, target)


def receive_content(*, organization: Organization, artifact_id: Any, stream: BinaryIO) -> Artifact:
    """The bytes of an upload the API takes itself (the filesystem backend's presigned
    flow); ``complete_upload`` still makes it visible."""
    artifact = _get(organization, artifact_id)
    if artifact.status != A.UPLOADING or artifact.upload_id:
        raise UploadMismatch("this artifact takes no content: it is not a pending upload")
    backend().save(artifact.key, stream, artifact.content_type)
    return artifact


def complete_upload(
    *,
    organization: Organization,
    artifact_id: Any,
    parts: list[dict[str, Any]] | None = None,
    sha256: str = "",
) -> Artifact:
    """Check what storage holds against the upload (size, and SHA-256 when given now or
    at the start) and make the artifact visible. Completing twice answers as once."""
    artifact = _get(organization, artifact_id)
    if artifact.status == A.AVAILABLE:
        return artifact
    if artifact.status != A.UPLOADING:
        raise ArtifactNotFound("not found")
    store = backend()
    if artifact.upload_id:
        if not parts:
            raise UploadMismatch("a multipart upload completes with its parts' ETags")
        store.complete_multipart(artifact.key, artifact.upload_id, parts)
        Artifact.objects.filter(pk=artifact.pk).update(upload_id="")
        artifact.upload_id = ""
    held = store.size(artifact.key)
    if held is None:
        raise UploadMismatch("nothing was uploaded yet")
    if held != artifact.size:
        raise UploadMismatch(f"the upload said {artifact.size} bytes; storage holds {held}")
    digest = hashlib.sha256()
    for chunk in store.chunks(artifact.key):
        digest.update(chunk)
    found = digest.hexdigest()
    for expected in (sha256.lower(), artifact.sha256):
        if expected and expected != found:
            raise UploadMismatch(f"sha256 {found} does not match the expected {expected}")
    return _available(artifact, Stored(held, found))


# --------------------------------------------------------------------------- reading
def _get(organization: Organization, artifact_id: Any) -> Artifact:
    artifact = (
        Artifact.objects.filter(organization=organization, pk=artifact_id, status__in=LIVE)
        .select_related("run")
        .first()
    )
    if artifact is None:
        raise ArtifactNotFound("not found")
    return artifact


@dataclass(frozen=True)
class Download:
    artifact: Artifact
    url: str | None  # a presigned URL to redirect to, or None: stream ``chunks``
    chunks: Iterator[bytes] | None


def download(*, organization: Organization, artifact_id: Any) -> Download:
    """Where to read an artifact; reading it keeps it at least an hour more."""
    artifact = _get(organization, artifact_id)
    if artifact.status != A.AVAILABLE:
        raise ArtifactNotReady("its upload has not completed")
    now = timezone.now()
    floor = now + GRACE
    extended = artifact.extended_until if (artifact.extended_until or now) > floor else floor
    Artifact.objects.filter(pk=artifact.pk).update(last_downloaded_at=now, extended_until=extended)
    artifact.extended_until, artifact.last_downloaded_at = extended, now
    store = backend()
    url = store.download_url(artifact.key, artifact.name, artifact.content_type)
    return Download(artifact, url, None if url else store.chunks(artifact.key))


# --------------------------------------------------------------------------- deleting
def delete(*, organization: Organization, artifact_id: Any) -> None:
    """Mark, then delete its object; storage unreachable now: the sweep finishes."""
    artifact = _get(organization, artifact_id)
    Artifact.objects.filter(pk=artifact.pk, status__in=LIVE).update(status=A.DELETING)
    _finish_deleting(artifact, timezone.now())


def _finish_deleting(artifact: Artifact, now: datetime) -> bool:
    try:
        _delete_object(artifact)
    except StorageUnavailable:
        return False
    Artifact.objects.filter(pk=artifact.pk, status=A.DELETING).update(
        status=A.DELETED, deleted_at=now, upload_id=""
    )
    return True


def sweep(now: datetime | None = None, batch: int | None = None) -> dict[str, int]:
    """The beat's look at artifacts, safe to run twice and at any point after a crash:

    - available artifacts past their expiry, and uploads abandoned (not completed within
      ARTIFACT_UPLOAD_SECONDS), are marked ``deleting``;
    - ``deleting`` rows have their object deleted, then are marked ``deleted``; one whose
      storage fails stays for the next sweep.

    At most ``batch`` (ARTIFACT_SWEEP_BATCH) rows of each kind per call."""
    now = now or timezone.now()
    batch = batch or settings.ARTIFACT_SWEEP_BATCH
    expired = list(expired_artifacts(now).values_list("pk", flat=True)[:batch])
    marked = Artifact.objects.filter(pk__in=expired, status=A.AVAILABLE).update(status=A.DELETING)
    abandoned_before = now - timedelta(seconds=settings.ARTIFACT_UPLOAD_SECONDS)
    stale = list(
        Artifact.objects.filter(status=A.UPLOADING, created_at__lt=abandoned_before).values_list(
            "pk", flat=True
        )[:batch]
    )
    abandoned = Artifact.objects.filter(pk__in=stale, status=A.UPLOADING).update(status=A.DELETING)
    deleted = failed = 0
    for artifact in Artifact.objects.filter(status=A.DELETING).order_by("created_at")[:batch]:
        if _finish_deleting(artifact, now):
            deleted += 1
        else:
            failed += 1
    return {"expired": marked, "abandoned": abandoned, "deleted": deleted, "failed": failed}


__all__ = [
    "ArtifactExists",
    "ArtifactNotFound",
    "ArtifactNotReady",
    "ArtifactTooLarge",
    "Download",
    "InvalidName",
    "QuotaExceeded",
    "RunStorageFull",
    "StorageUnavailable",
    "TooManyUploads",
    "Upload",
    "UploadMismatch",
    "complete_upload",
    "delete",
    "download",
    "receive_content",
    "start_upload",
    "sweep",
    "upload",
]
