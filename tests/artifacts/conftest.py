"""Artifact storage for tests: the filesystem under a temporary directory, and S3 over
real HTTP to moto's server mode, started once per session on a free loopback port
(never a mock of boto3)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import httpx
import pytest

from artifacts import storage
from tests.support import Child, child_env, free_port, python_cmd, wait_until

BACKENDS = ("filesystem", "s3")
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """moto's S3 server on 127.0.0.1; yields its URL."""
    port = free_port()
    log = tmp_path_factory.mktemp("moto") / "moto.log"
    server = Child(
        python_cmd("-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)), child_env(), log
    )
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        if not server.alive():
            raise AssertionError(f"moto exited:\n{server.output()}")
        try:
            return httpx.get(f"{url}/moto-api/", timeout=1).status_code < 500
        except httpx.TransportError:
            return False

    try:
        wait_until(up, timeout=60, what="moto's S3 server to answer")
        yield url
    finally:
        server.stop(timeout=10)
        server.kill_group()


def use_s3(settings: Any, monkeypatch: pytest.MonkeyPatch, endpoint: str) -> str:
    """Point artifacts at a new bucket of ``endpoint``; return the bucket's name."""
    for name, value in CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    bucket = f"artifacts-{uuid.uuid4().hex[:12]}"
    settings.ARTIFACTS_BACKEND = "s3"
    settings.ARTIFACTS_S3_BUCKET = bucket
    settings.ARTIFACTS_S3_ENDPOINT_URL = endpoint
    storage._backend.cache_clear()
    return bucket


@pytest.fixture(params=BACKENDS)
def backend(
    request: pytest.FixtureRequest,
    settings: Any,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> Iterator[str]:
    """Each test once per backend: the filesystem (a fresh root), and S3 (a fresh
    bucket on the session's moto server)."""
    if request.param == "s3":
        endpoint = request.getfixturevalue("s3_server")
        bucket = use_s3(settings, monkeypatch, endpoint)
        client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
        client.create_bucket(Bucket=bucket)
    else:
        settings.ARTIFACTS_BACKEND = "filesystem"
        settings.ARTIFACTS_ROOT = str(tmp_path / "artifacts")
        storage._backend.cache_clear()
    yield str(request.param)
    storage._backend.cache_clear()
