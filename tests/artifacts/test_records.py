"""What artifacts keep on record: their invariants (checked by ``check_invariants``),
the storage each run and organization held (for billing, not charged yet), the sweep
under a storage outage, and the run's admin page linking to its artifacts."""

from __future__ import annotations

import io
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from artifacts import services, storage
from artifacts.invariants import artifact_expiry, artifact_ownership, artifact_unique
from artifacts.models import Artifact
from artifacts.selectors import organization_storage, run_storage
from common.invariants import check_all
from runs import services as run_services
from runs.models import Run
from tests import factories
from tests.api import states
from tests.artifacts.conftest import use_s3
from tests.support import free_port

pytestmark = pytest.mark.django_db


def save(run: Run, name: str, data: bytes) -> Artifact:
    return services.upload(
        organization=run.organization,
        run_id=run.pk,
        name=name,
        stream=io.BytesIO(data),
        size=len(data),
    )


def test_artifacts_keep_every_invariant_through_their_life(backend: str) -> None:
    run = states.running(factories.org())
    kept, dropped = save(run, "kept", b"k" * 10), save(run, "dropped", b"d" * 5)
    services.delete(organization=run.organization, artifact_id=dropped.pk)
    run_services.run_cancel(run_id=run.pk, reason="ended")

    assert check_all("artifacts.") == {
        "artifacts.expiry": [],
        "artifacts.ownership": [],
        "artifacts.unique": [],
    }
    assert Artifact.objects.get(pk=kept.pk).status == "available"


def test_each_artifact_invariant_names_what_breaks_it(backend: str) -> None:
    run, other = states.running(factories.org()), states.running(factories.org())
    artifact = save(run, "a", b"abc")
    Artifact.objects.filter(pk=artifact.pk).update(organization=other.organization)
    assert any("its run's is" in p for p in artifact_ownership())
    assert any("not under its organization" in p for p in artifact_ownership())

    twin = save(other, "twin", b"x")
    # The database refuses a second live name; an earlier schema might not have.
    Artifact.objects.filter(pk=twin.pk).update(status="deleted", deleted_at=None)
    assert any("deleted without a deletion time" in p for p in artifact_expiry())
    Artifact.objects.filter(pk=twin.pk).update(key=artifact.key + "-other")
    assert artifact_unique() == []

    Artifact.objects.filter(pk=artifact.pk).update(sha256="")
    assert any("without a SHA-256" in p for p in artifact_expiry())
    Run.objects.filter(pk=run.pk).update(status="completed", completed_at=None)
    assert any("no expiry" in p for p in artifact_expiry())


def test_storage_is_recorded_per_run_and_organization_in_byte_hours(backend: str) -> None:
    organization = factories.org()
    run, second = states.running(organization), states.running(organization)
    first = save(run, "first", b"1" * 1000)
    save(second, "second", b"2" * 500)
    gone = save(run, "gone", b"3" * 2000)
    start = timezone.now()
    Artifact.objects.filter(run__organization=organization).update(completed_at=start)
    # "gone" was held for 2 hours, then deleted.
    services.delete(organization=organization, artifact_id=gone.pk)
    Artifact.objects.filter(pk=gone.pk).update(deleted_at=start + timedelta(hours=2))

    later = start + timedelta(hours=3)
    usage = run_storage(run, until=later)
    assert usage.bytes_held == 1000  # what it holds now
    assert usage.byte_hours == Decimal(1000 * 3 + 2000 * 2)
    totals = organization_storage(until=later)[organization.pk]
    assert totals.bytes_held == 1500
    assert totals.byte_hours == Decimal(1000 * 3 + 500 * 3 + 2000 * 2)
    assert run_storage(states.running(organization)).bytes_held == 0
    assert Artifact.objects.get(pk=first.pk).size == 1000


def test_the_sweep_leaves_what_storage_cannot_delete_and_finishes_it_later(
    backend: str, settings: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    run = states.running(factories.org())
    artifact = save(run, "expiring", b"e" * 64)
    run_services.run_cancel(run_id=run.pk, reason="ended")
    later = timezone.now() + timedelta(days=settings.ARTIFACT_RETENTION_DAYS + 1)
    working = (
        settings.ARTIFACTS_BACKEND,
        settings.ARTIFACTS_ROOT,
        settings.ARTIFACTS_S3_ENDPOINT_URL,
        settings.ARTIFACTS_S3_BUCKET,
    )
    if backend == "s3":
        bucket = settings.ARTIFACTS_S3_BUCKET
        use_s3(settings, monkeypatch, f"http://127.0.0.1:{free_port()}")  # nothing listens
        settings.ARTIFACTS_S3_BUCKET = bucket
    else:
        # The root made unreadable by replacing a directory on its path with a file.
        blocker = tmp_path / "moved"
        blocker.write_text("not a directory")
        settings.ARTIFACTS_ROOT = str(blocker)
    storage._backend.cache_clear()

    assert services.sweep(now=later) == {"expired": 1, "abandoned": 0, "deleted": 0, "failed": 1}
    assert Artifact.objects.get(pk=artifact.pk).status == "deleting"

    (
        settings.ARTIFACTS_BACKEND,
        settings.ARTIFACTS_ROOT,
        settings.ARTIFACTS_S3_ENDPOINT_URL,
        settings.ARTIFACTS_S3_BUCKET,
    ) = working
    storage._backend.cache_clear()
    if backend == "filesystem":
        # The filesystem "outage" hid the file rather than failing a delete: check the
        # object is still there, so the retry is what removes it.
        assert storage.backend().size(artifact.key) == 64
    assert services.sweep(now=later) == {"expired": 0, "abandoned": 0, "deleted": 1, "failed": 0}
    row = Artifact.objects.get(pk=artifact.pk)
    assert row.status == "deleted"
    assert row.deleted_at is not None
    assert storage.backend().size(artifact.key) is None


def test_the_run_page_links_to_its_artifacts(client: Client, backend: str) -> None:
    client.force_login(User.objects.create_superuser("ops", "ops@example.com", "long-password"))
    run = states.running(factories.org())
    save(run, "linked.txt", b"hello")
    save(states.running(run.organization), "elsewhere.txt", b"other")

    page = client.get(f"/admin/runs/run/{run.pk}/change/")
    assert page.status_code == 200
    link = f"/admin/artifacts/artifact/?q={run.pk}"
    assert link.encode() in page.content
    listing = client.get(link)
    assert b"linked.txt" in listing.content
    assert b"elsewhere.txt" not in listing.content
