"""Artifacts in the admin: listed with their expiry, downloaded through the service the
API uses, and the storage each organization holds."""

from __future__ import annotations

import io

import pytest
from django.test import Client

from artifacts import services
from tests import factories
from tests.api import states

pytestmark = pytest.mark.django_db


def test_an_operator_lists_downloads_and_sees_storage_per_organization(
    operator: Client, backend: str
) -> None:
    organization = factories.org(name="acme")
    run = states.running(organization)
    artifact = services.upload(
        organization=organization,
        run_id=run.pk,
        name="numbers.csv",
        stream=io.BytesIO(b"1,2,3\n"),
        size=6,
        content_type="text/csv",
    )

    listing = operator.get("/admin/artifacts/artifact/")
    assert listing.status_code == 200
    assert b"numbers.csv" in listing.content
    download = operator.get(f"/admin/artifacts/artifact/{artifact.pk}/download/")
    if backend == "s3":
        assert download.status_code == 302
        assert "X-Amz-Signature" in download["Location"]
    else:
        assert download.status_code == 200
        assert b"".join(download.streaming_content) == b"1,2,3\n"  # type: ignore[attr-defined]
    storage = operator.get("/admin/artifacts/organizationstorage/")
    assert storage.status_code == 200
    assert b"acme" in storage.content
    assert b">6<" in storage.content


def test_the_admin_download_needs_staff(client: Client) -> None:
    organization = factories.org()
    run = states.running(organization)
    artifact = services.upload(
        organization=organization, run_id=run.pk, name="x", stream=io.BytesIO(b"x"), size=1
    )
    response = client.get(f"/admin/artifacts/artifact/{artifact.pk}/download/")
    assert response.status_code == 302
    assert "/admin/login/" in response["Location"]
