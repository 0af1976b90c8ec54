"""Artifacts through the API, on both backends (the filesystem, and S3 over HTTP to
moto's server): upload, list, download byte for byte, the presigned flow, names, the
limits, isolation, expiry and its sweep, and storage outages."""

from __future__ import annotations

import hashlib
import uuid
from datetime import timedelta
from typing import Any

import boto3
import httpx
import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from artifacts import storage
from artifacts.models import Artifact
from artifacts.services import sweep
from runs import services as run_services
from runs.models import Run
from tests import factories
from tests.artifacts.conftest import use_s3
from tests.support import free_port
from tests.tenants import Tenant, make_tenant

pytestmark = pytest.mark.django_db(transaction=True)

DATA = bytes(range(256)) * 40 + b"tail"  # 10,244 bytes, every byte value


def new_run(tenant: Tenant) -> Run:
    return run_services.run_create(organization=tenant.organization, plan=factories.plan())


def upload(tenant: Tenant, run: Run, name: str = "report.bin", data: bytes = DATA) -> Any:
    body = {"name": name, "file": SimpleUploadedFile("x", data, "application/x-test")}
    return tenant.client.post(f"/api/v1/runs/{run.pk}/artifacts", body, format="multipart")


def fetch(tenant: Tenant, artifact_id: str) -> bytes:
    """Download through the API: the bytes, or the presigned URL's bytes."""
    response = tenant.client.get(f"/api/v1/artifacts/{artifact_id}/download")
    if response.status_code == 302:
        url = response["Location"]
        return httpx.get(url, timeout=10).raise_for_status().content
    assert response.status_code == 200, response
    return b"".join(response.streaming_content)  # type: ignore[attr-defined]


def end(run: Run) -> Run:
    return run_services.run_cancel(run_id=run.pk, reason="done with it")


# --------------------------------------------------------------------------- basics
def test_upload_list_show_and_download_byte_for_byte(backend: str) -> None:
    tenant = make_tenant()
    run = new_run(tenant)

    created = upload(tenant, run)
    assert created.status_code == 201, created.json()
    body = created.json()
    assert body["name"] == "report.bin"
    assert body["size"] == len(DATA)
    assert body["sha256"] == hashlib.sha256(DATA).hexdigest()
    assert body["content_type"] == "application/x-test"
    assert body["status"] == "available"
    assert body["expires_at"] is None  # the run has not ended
    assert body["download_url"].endswith(f"/api/v1/artifacts/{body['id']}/download")

    listed = tenant.client.get(f"/api/v1/runs/{run.pk}/artifacts").json()
    assert [a["id"] for a in listed["results"]] == [body["id"]]
    assert tenant.client.get(f"/api/v1/artifacts/{body['id']}").json() == body
    assert fetch(tenant, body["id"]) == DATA
    key = Artifact.objects.get(pk=body["id"]).key
    assert key.startswith(f"{tenant.organization.pk}/{run.pk}/")
    assert "report" not in key  # never derived from what the client wrote


def test_a_name_is_taken_once_per_run_until_deleted(backend: str) -> None:
    tenant = make_tenant()
    run = new_run(tenant)
    first = upload(tenant, run).json()

    again = upload(tenant, run)
    assert again.status_code == 409
    assert again.json()["code"] == "artifact_exists"
    assert upload(tenant, new_run(tenant)).status_code == 201  # another run: fine

    assert tenant.client.delete(f"/api/v1/artifacts/{first['id']}").status_code == 204
    assert tenant.client.get(f"/api/v1/artifacts/{first['id']}").status_code == 404
    assert upload(tenant, run).status_code == 201
    assert Artifact.objects.get(pk=first["id"]).status == "deleted"


def test_a_deleted_run_takes_no_uploads(backend: str) -> None:
    tenant = make_tenant()
    run = new_run(tenant)
    run_services.run_delete(run_id=run.pk)

    refused = upload(tenant, run)
    assert refused.status_code == 409
    assert refused.json()["code"] == "run_deleted"


# --------------------------------------------------------------------------- presigned
def send(tenant: Tenant, upload_: dict[str, Any], data: bytes) -> list[dict[str, Any]]:
    """PUT the bytes where the API said; the parts' ETags for a multipart upload."""
    if upload_["parts"]:
        size = upload_["part_size"]
        parts = []
        for part in upload_["parts"]:
            start = (part["part_number"] - 1) * size
            sent = httpx.put(part["url"], content=data[start : start + size], timeout=30)
            parts.append({"part_number": part["part_number"], "etag": sent.headers["ETag"]})
        return parts
    if upload_["api_key"]:
        path = upload_["url"][upload_["url"].index("/api/v1/") :]
        response = tenant.client.put(path, data, content_type=upload_["headers"]["Content-Type"])
        assert response.status_code == 204, response
    else:
        httpx.put(upload_["url"], content=data, headers=upload_["headers"], timeout=30)
    return []


def start(tenant: Tenant, run: Run, size: int, name: str = "big.bin", **extra: Any) -> Any:
    body = {"name": name, "size": size, "content_type": "application/x-test", **extra}
    return tenant.post(f"/api/v1/runs/{run.pk}/artifacts/uploads", body)


def test_a_presigned_upload_becomes_visible_once_completed(backend: str) -> None:
    tenant = make_tenant()
    run = new_run(tenant)
    started = start(tenant, run, len(DATA), sha256=hashlib.sha256(DATA).hexdigest())
    assert started.status_code == 201, started.json()
    artifact, target = started.json()["artifact"], started.json()["upload"]
    assert artifact["status"] == "uploading"
    assert target["api_key"] is (backend == "filesystem")

    assert tenant.client.get(f"/api/v1/artifacts/{artifact['id']}/download").status_code == 409
    early = tenant.post(f"/api/v1/artifacts/{artifact['id']}/complete", {})
    assert early.status_code == 409
    assert early.json()["code"] == "upload_mismatch"  # nothing uploaded yet
    parts = send(tenant, target, DATA)
    done = tenant.post(f"/api/v1/artifacts/{artifact['id']}/complete", {"parts": parts})
    assert done.status_code == 200, done.json()
    assert done.json()["status"] == "available"
    assert done.json()["sha256"] == hashlib.sha256(DATA).hexdigest()
    assert fetch(tenant, artifact["id"]) == DATA


def test_a_presigned_upload_of_the_wrong_size_or_checksum_stays_open(backend: str) -> None:
    tenant = make_tenant()
    run = new_run(tenant)
    target = start(tenant, run, len(DATA) + 1).json()
    send(tenant, target["upload"], DATA)
    complete = f"/api/v1/artifacts/{target['artifact']['id']}/complete"

    short = tenant.post(complete, {})
    assert short.status_code == 409
    assert "storage holds" in short.json()["message"]
    other = start(tenant, run, len(DATA), name="other.bin").json()
    send(tenant, other["upload"], DATA)
    wrong = tenant.post(
        f"/api/v1/artifacts/{other['artifact']['id']}/complete", {"sha256": "0" * 64}
    )
    assert wrong.status_code == 409
    assert "does not match" in wrong.json()["message"]
    assert Artifact.objects.get(pk=other["artifact"]["id"]).status == "uploading"


def test_a_large_presigned_upload_is_multipart(
    s3_server: str, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    bucket = use_s3(settings, monkeypatch, s3_server)
    boto3.client("s3", endpoint_url=s3_server, region_name="us-east-1").create_bucket(Bucket=bucket)
    settings.ARTIFACT_MULTIPART_THRESHOLD = 6 * 1024**2
    settings.ARTIFACT_MULTIPART_PART_SIZE = 5 * 1024**2
    data = bytes(range(256)) * (28 * 1024)  # 7 MiB: two parts
    tenant = make_tenant()
    run = new_run(tenant)

    started = start(tenant, run, len(data)).json()
    assert [p["part_number"] for p in started["upload"]["parts"]] == [1, 2]
    parts = send(tenant, started["upload"], data)
    done = tenant.post(f"/api/v1/artifacts/{started['artifact']['id']}/complete", {"parts": parts})
    assert done.status_code == 200, done.json()
    assert fetch(tenant, started["artifact"]["id"]) == data


# --------------------------------------------------------------------------- limits
def test_at_most_so_many_uploads_in_flight(backend: str, settings: Any) -> None:
    settings.ARTIFACT_MAX_IN_FLIGHT = 2
    tenant = make_tenant()
    run = new_run(tenant)
    for name in ("a", "b"):
        assert start(tenant, run, 10, name=name).status_code == 201

    refused = start(tenant, run, 10, name="c")
    assert refused.status_code == 429
    assert refused.json()["code"] == "too_many_uploads"
    assert int(refused["Retry-After"]) > 0
    assert upload(tenant, run, name="d").status_code == 429


def test_a_run_holds_at_most_so_many_bytes(backend: str, settings: Any) -> None:
    settings.ARTIFACT_RUN_MAX_BYTES = len(DATA) + 100
    settings.ARTIFACT_MAX_FILE_BYTES = len(DATA) + 100
    tenant = make_tenant()
    run = new_run(tenant)
    assert upload(tenant, run, name="one").status_code == 201

    full = upload(tenant, run, name="two")
    assert full.status_code == 413
    assert full.json()["code"] == "run_storage_full"
    too_big = upload(tenant, new_run(tenant), data=DATA * 2)
    assert too_big.status_code == 413
    assert too_big.json()["code"] == "artifact_too_large"
    assert Artifact.objects.filter(run=run).count() == 1


# --------------------------------------------------------------------------- isolation
def test_another_organization_finds_nothing_on_any_route(backend: str) -> None:
    owner, stranger = make_tenant(), make_tenant()
    run = new_run(owner)
    artifact = upload(owner, run).json()["id"]

    for method, path in (
        ("get", f"/api/v1/runs/{run.pk}/artifacts"),
        ("get", f"/api/v1/artifacts/{artifact}"),
        ("get", f"/api/v1/artifacts/{artifact}/download"),
        ("delete", f"/api/v1/artifacts/{artifact}"),
        ("post", f"/api/v1/artifacts/{artifact}/complete"),
        ("post", f"/api/v1/runs/{run.pk}/artifacts/uploads"),
    ):
        body = {"name": "x", "size": 1} if path.endswith("uploads") else {}
        response = getattr(stranger.client, method)(path, body, format="json")
        assert response.status_code == 404, (method, path, response.status_code)
    assert upload(stranger, run).status_code == 404
    assert Artifact.objects.get(pk=artifact).status == "available"


# --------------------------------------------------------------------------- expiry
def test_expiry_follows_the_run_and_downloads_extend_it(backend: str, settings: Any) -> None:
    tenant = make_tenant()
    run = new_run(tenant)
    before = upload(tenant, run, name="before").json()
    run = end(run)
    retention = timedelta(days=settings.ARTIFACT_RETENTION_DAYS)

    shown = tenant.client.get(f"/api/v1/artifacts/{before['id']}").json()
    assert shown["expires_at"] == (run.completed_at + retention).isoformat().replace("+00:00", "Z")
    # The run ended long ago: an upload now is kept an hour, a download an hour more.
    Run.objects.filter(pk=run.pk).update(completed_at=timezone.now() - retention)
    after = upload(tenant, run, name="after").json()
    left = _expiry(tenant, after["id"]) - timezone.now()
    assert timedelta(minutes=59) < left <= timedelta(hours=1)
    assert _expiry(tenant, before["id"]) < timezone.now()
    fetch(tenant, before["id"])
    assert _expiry(tenant, before["id"]) > timezone.now() + timedelta(minutes=59)


def _expiry(tenant: Tenant, artifact_id: str) -> Any:
    text = tenant.client.get(f"/api/v1/artifacts/{artifact_id}").json()["expires_at"]
    return parse_datetime(text)


def test_the_sweep_deletes_expired_artifacts_in_batches_and_once(backend: str) -> None:
    tenant = make_tenant()
    run = new_run(tenant)
    ids = [upload(tenant, run, name=f"f{i}").json()["id"] for i in range(5)]
    keep = upload(tenant, new_run(tenant), name="kept").json()["id"]  # its run goes on
    end(run)
    later = timezone.now() + timedelta(days=31)

    assert sweep(now=later, batch=2) == {"expired": 2, "abandoned": 0, "deleted": 2, "failed": 0}
    assert sweep(now=later, batch=10)["deleted"] == 3
    assert sweep(now=later) == {"expired": 0, "abandoned": 0, "deleted": 0, "failed": 0}
    statuses = dict(Artifact.objects.values_list("pk", "status"))
    assert {statuses[i] for i in map(_uuid, ids)} == {"deleted"}
    assert statuses[_uuid(keep)] == "available"
    for artifact in Artifact.objects.filter(pk__in=ids):
        assert storage.backend().size(artifact.key) is None  # the objects are gone


def _uuid(text: str) -> Any:
    return uuid.UUID(text)


def test_a_crash_between_deleting_the_object_and_marking_the_row_is_finished_by_the_sweep(
    backend: str,
) -> None:
    tenant = make_tenant()
    run = new_run(tenant)
    gone = Artifact.objects.get(pk=upload(tenant, run, name="gone").json()["id"])
    kept = Artifact.objects.get(pk=upload(tenant, run, name="kept").json()["id"])
    # Marked, then the process died: one before deleting its object, one after.
    Artifact.objects.filter(pk__in=[gone.pk, kept.pk]).update(status="deleting")
    storage.backend().delete(gone.key)

    assert sweep()["deleted"] == 2
    assert set(Artifact.objects.values_list("status", flat=True)) == {"deleted"}
    assert storage.backend().size(kept.key) is None


def test_an_abandoned_presigned_upload_is_removed(backend: str, settings: Any) -> None:
    tenant = make_tenant()
    run = new_run(tenant)
    started = start(tenant, run, len(DATA)).json()
    send(tenant, started["upload"], DATA)
    later = timezone.now() + timedelta(seconds=settings.ARTIFACT_UPLOAD_SECONDS + 1)

    assert sweep(now=later)["abandoned"] == 1
    artifact = Artifact.objects.get(pk=started["artifact"]["id"])
    assert artifact.status == "deleted"
    assert storage.backend().size(artifact.key) is None


# --------------------------------------------------------------------------- outages
def test_storage_down_answers_503_and_records_nothing(
    backend: str, settings: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    tenant = make_tenant()
    run = new_run(tenant)
    if backend == "s3":
        use_s3(settings, monkeypatch, f"http://127.0.0.1:{free_port()}")  # nothing listens
    else:
        blocker = tmp_path / "not-a-directory"
        blocker.write_text("a file where the root should be")
        settings.ARTIFACTS_ROOT = str(blocker)
        storage._backend.cache_clear()

    refused = upload(tenant, run)
    assert refused.status_code == 503
    assert refused.json()["code"] == "storage_unavailable"
    assert refused["Retry-After"]
    assert tenant.client.get(f"/api/v1/runs/{run.pk}/artifacts").json()["results"] == []
    assert not Artifact.objects.filter(run=run, status__in=["uploading", "available"]).exists()
