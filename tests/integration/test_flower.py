"""Flower runs against the broker behind basic authentication."""

from __future__ import annotations

import base64
from collections.abc import Iterator

import httpx
import pytest

from tests.support import Child, child_env, free_port, python_cmd, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

CREDENTIALS = "sre:flower-test-password"


@pytest.fixture
def flower(celery_worker: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    process = Child(
        python_cmd("-m", "config.flower"),
        child_env(FLOWER_BASIC_AUTH=CREDENTIALS, FLOWER_PORT=str(port)),
        tmp_path_factory.mktemp("flower") / "flower.log",
    )
    url = f"http://127.0.0.1:{port}"

    def listening() -> bool:
        if not process.alive():
            raise AssertionError(f"flower exited:\n{process.output()}")
        try:
            httpx.get(url, timeout=1)
        except httpx.TransportError:
            return False
        return True

    try:
        wait_until(listening, timeout=60, what="Flower to listen")
        yield url
    finally:
        process.stop()
        process.kill_group()


def test_flower_lists_the_worker_with_credentials_and_refuses_without(
    flower: str, celery_worker: str
) -> None:
    token = base64.b64encode(CREDENTIALS.encode()).decode()

    def workers() -> dict[str, object] | None:
        response = httpx.get(
            f"{flower}/api/workers", headers={"Authorization": f"Basic {token}"}, timeout=10
        )
        assert response.status_code == 200
        listed: dict[str, object] = response.json()
        return listed if celery_worker in listed else None

    assert celery_worker in wait_until(workers, timeout=30, what="Flower to list the worker")
    assert httpx.get(f"{flower}/api/workers", timeout=10).status_code == 401
    wrong = base64.b64encode(b"sre:wrong").decode()
    response = httpx.get(
        f"{flower}/api/workers", headers={"Authorization": f"Basic {wrong}"}, timeout=10
    )
    assert response.status_code == 401


def test_flower_refuses_to_start_without_credentials(tmp_path_factory: pytest.TempPathFactory):
    process = Child(
        python_cmd("-m", "config.flower"),
        child_env(FLOWER_BASIC_AUTH="", FLOWER_PORT=str(free_port())),
        tmp_path_factory.mktemp("flower-noauth") / "flower.log",
    )
    assert process.proc.wait(60) != 0
    assert "FLOWER_BASIC_AUTH is not set" in process.output()
