"""The web process as production runs it, for integration tests: gunicorn with the real
config/gunicorn.py (gevent workers, the pooled database connections) on a free loopback
port, against the test database and Redis."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.support import Child, child_env, free_port, python_cmd, wait_until


@dataclass(frozen=True)
class Web:
    url: str
    log: Path


@contextmanager
def gunicorn(
    tmp_path_factory: pytest.TempPathFactory, *, workers: int = 1, **env: str
) -> Iterator[Web]:
    """Serve the API with gunicorn until the block ends; yields its URL and log. ``env``
    is added to the server's environment (settings such as ``API_STREAM_HEARTBEAT_S``)."""
    log = tmp_path_factory.mktemp("web") / "web.log"
    port = free_port()
    server = Child(
        python_cmd(
            "-m", "gunicorn", "config.wsgi:application",
            "--config", "config/gunicorn.py",
            "--bind", f"127.0.0.1:{port}",
            "--workers", str(workers),
        ),
        # At the test settings' level (WARNING): gunicorn's access log, a line per
        # request, is written only at INFO (config/gunicorn.py).
        child_env(**{"LOG_LEVEL": os.environ.get("LOG_LEVEL") or "WARNING", **env}),
        log,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        if not server.alive():
            raise AssertionError(f"gunicorn exited:\n{server.output()}")
        # A route that answers at once without a key (401): the schema's page, generated
        # on a first request, took longer than a short timeout on a loaded machine, and
        # every probe then timed out however long the wait.
        try:
            return httpx.get(f"{url}/api/v1/runs", timeout=10).status_code == 401
        except httpx.TransportError:
            return False

    try:
        wait_until(up, timeout=60, what="gunicorn to serve the API")
        yield Web(url, log)
    finally:
        server.stop(timeout=10)
        server.kill_group()
