"""The organization's artifact quotas (billing/quotas.py `artifacts`, `artifact_bytes`):
counted over all its runs' stored artifacts, not deleted or expired ones, checked when an
upload is reserved (409 `quota_exceeded`), exact when two uploads race, shown with their
use at `GET /api/v1/organization`."""

from __future__ import annotations

import io
import threading
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import connection, transaction
from django.utils import timezone

from artifacts import services, storage
from artifacts.models import Artifact
from billing import quotas
from billing.quotas import QuotaExceeded
from runs import services as run_services
from runs.models import Run
from tests import factories
from tests.billing.test_quotas import _waiting_for_a_quota_lock
from tests.support import wait_until
from tests.tenants import Tenant, make_tenant


@pytest.fixture(autouse=True)
def filesystem(settings: Any, tmp_path: Path) -> Iterator[None]:
    settings.ARTIFACTS_BACKEND = "filesystem"
    settings.ARTIFACTS_ROOT = str(tmp_path / "artifacts")
    storage._backend.cache_clear()
    yield
    storage._backend.cache_clear()


def new_run(tenant: Tenant) -> Run:
    return run_services.run_create(organization=tenant.organization, plan=factories.plan())


def upload(tenant: Tenant, run: Run, name: str, data: bytes = b"abc") -> Any:
    body = {"name": name, "file": SimpleUploadedFile("x", data, "application/x-test")}
    return tenant.client.post(f"/api/v1/runs/{run.pk}/artifacts", body, format="multipart")


@pytest.mark.django_db
def test_one_artifact_past_the_organizations_count_is_409_whatever_its_run() -> None:
    tenant = make_tenant()
    quotas.quotas_set(tenant.organization.pk, actor="test", artifacts=2)
    first = upload(tenant, new_run(tenant), "a")
    assert first.status_code == 201
    assert upload(tenant, new_run(tenant), "b").status_code == 201

    refused = upload(tenant, new_run(tenant), "c")

    assert refused.status_code == 409
    assert refused.json() == {
        "code": "quota_exceeded",
        "message": "the organization has 2 artifacts stored, its quota; delete one, or ask "
        "an operator to raise the quota",
        "details": {"quota": "artifacts", "limit": 2},
    }
    assert Artifact.objects.filter(organization=tenant.organization).count() == 2
    # A deleted one frees its place.
    assert tenant.client.delete(f"/api/v1/artifacts/{first.json()['id']}").status_code == 204
    assert upload(tenant, new_run(tenant), "c").status_code == 201


@pytest.mark.django_db
def test_an_upload_that_would_take_the_organization_past_its_bytes_is_409(
    settings: Any,
) -> None:
    settings.QUOTA_ARTIFACT_BYTES = 10  # the default, for an organization without its own
    tenant = make_tenant()
    assert upload(tenant, new_run(tenant), "six", b"x" * 6).status_code == 201

    refused = upload(tenant, new_run(tenant), "five", b"x" * 5)
    declared = tenant.post(
        f"/api/v1/runs/{new_run(tenant).pk}/artifacts/uploads", {"name": "big", "size": 5}
    )

    assert refused.status_code == 409
    assert refused.json() == {
        "code": "quota_exceeded",
        "message": "the organization has 6 bytes of artifacts stored; 5 more would exceed "
        "its quota of 10; delete some, or ask an operator to raise the quota",
        "details": {"quota": "artifact_bytes", "limit": 10},
    }
    # A presigned upload holds its declared size from its start.
    assert (declared.status_code, declared.json()["code"]) == (409, "quota_exceeded")
    assert upload(tenant, new_run(tenant), "four", b"x" * 4).status_code == 201
    assert Artifact.objects.filter(organization=tenant.organization).count() == 2


@pytest.mark.django_db
def test_expired_artifacts_and_another_organizations_do_not_count(settings: Any) -> None:
    tenant, other = make_tenant(), make_tenant()
    quotas.quotas_set(tenant.organization.pk, actor="test", artifacts=1)
    run = new_run(tenant)
    assert upload(tenant, run, "old").status_code == 201
    assert upload(other, new_run(other), "theirs").status_code == 201
    assert upload(tenant, new_run(tenant), "refused").status_code == 409

    run_services.run_cancel(run_id=run.pk, reason="done")
    retention = timedelta(days=settings.ARTIFACT_RETENTION_DAYS, minutes=1)
    Run.objects.filter(pk=run.pk).update(completed_at=timezone.now() - retention)

    assert upload(tenant, new_run(tenant), "new").status_code == 201


@pytest.mark.django_db
def test_the_organization_shows_its_artifact_quotas_and_their_use(settings: Any) -> None:
    settings.QUOTA_ARTIFACT_BYTES = 1000
    tenant = make_tenant()
    quotas.quotas_set(tenant.organization.pk, actor="test", artifacts=5)
    run = new_run(tenant)
    assert upload(tenant, run, "a", b"x" * 100).status_code == 201
    started = tenant.post(f"/api/v1/runs/{run.pk}/artifacts/uploads", {"name": "b", "size": 50})
    assert started.status_code == 201  # uploading: it holds its place and its bytes

    shown = tenant.get("/api/v1/organization").json()["quotas"]

    assert shown["artifacts"] == {"limit": 5, "used": 2}
    assert shown["artifact_bytes"] == {"limit": 1000, "used": 150}


@pytest.mark.django_db(transaction=True)
def test_two_uploads_at_once_to_two_runs_never_both_take_the_last_bytes() -> None:
    """The first upload holds its transaction open after its reservation; the second, to
    another run (another run lock), must wait for the quota's lock, then count the
    first's bytes and be refused."""
    organization = factories.org()
    quotas.quotas_set(organization.pk, actor="test", artifact_bytes=10)
    organization.refresh_from_db()
    runs = [factories.run(organization), factories.run(organization)]
    first_reserved, first_may_commit = threading.Event(), threading.Event()
    outcomes: dict[str, str] = {}

    def save(run: Run, name: str) -> None:
        services.upload(
            organization=organization, run_id=run.pk, name=name, stream=io.BytesIO(b"x" * 6),
            size=6,
        )  # fmt: skip

    def first() -> None:
        try:
            with transaction.atomic():
                save(runs[0], "first")
                first_reserved.set()
                first_may_commit.wait(30)
            outcomes["first"] = "stored"
        finally:
            connection.close()

    def second() -> None:
        try:
            save(runs[1], "second")
            outcomes["second"] = "stored"
        except QuotaExceeded as exc:
            outcomes["second"] = f"refused: {exc.details}"
        finally:
            connection.close()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    threads[0].start()
    assert first_reserved.wait(30)
    threads[1].start()
    wait_until(_waiting_for_a_quota_lock, what="the second upload to wait for the quota's lock")
    first_may_commit.set()
    for thread in threads:
        thread.join(30)

    assert outcomes == {
        "first": "stored",
        "second": "refused: {'quota': 'artifact_bytes', 'limit': 10}",
    }
    assert list(Artifact.objects.values_list("name", flat=True)) == ["first"]
