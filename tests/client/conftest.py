"""The client and the CLI against the real API: pytest-django's live server (real HTTP on
127.0.0.1) and, for runs that must execute, the session's real Celery worker
(tests/conftest.py). The CLI is the installed console script, run as a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from orchestrator_client import Client
from tests.tenants import LiveTenant

# scripts/bootstrap.sh installs the checkout (`pip install -e .`): the script sits next to
# the interpreter running the tests.
ORCH = Path(sys.executable).parent / "orch"


@pytest.fixture
def tenant(live: LiveTenant) -> LiveTenant:
    """The live server's tenant (``live``), under the name the client's tests give it."""
    return live


@pytest.fixture
def client(tenant: LiveTenant) -> Iterator[Client]:
    with Client(tenant.url, tenant.key, timeout=10) as api:
        yield api


@dataclass
class Orch:
    """The installed ``orch``, with its own HOME and config directory."""

    env: dict[str, str]
    cwd: Path

    def run(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(ORCH), *args],
            env=self.env,
            cwd=self.cwd,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def json(self, *args: str, code: int = 0) -> Any:
        """Run with ``--json``; the exit code must be ``code`` and stdout one JSON document."""
        result = self.run(*args, "--json")
        assert result.returncode == code, (result.stdout, result.stderr)
        return json.loads(result.stdout)

    def start(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [str(ORCH), *args],
            env=self.env,
            cwd=self.cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )


def orch_env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_")}
    env.update(HOME=str(home), XDG_CONFIG_HOME=str(home / ".config"), PYTHONUNBUFFERED="1")
    env.update(extra)
    return env


@pytest.fixture
def orch(tenant: LiveTenant, tmp_path: Path) -> Orch:
    """``orch`` set up by the environment (ORCH_URL, ORCH_API_KEY) for ``tenant``."""
    if not ORCH.exists():
        pytest.fail(f"{ORCH} is not installed: run scripts/bootstrap.sh (make install)")
    return Orch(orch_env(tmp_path, ORCH_URL=tenant.url, ORCH_API_KEY=tenant.key), tmp_path)


@pytest.fixture
def bare_orch(tmp_path: Path) -> Orch:
    """``orch`` with nothing configured."""
    if not ORCH.exists():
        pytest.fail(f"{ORCH} is not installed: run scripts/bootstrap.sh (make install)")
    return Orch(orch_env(tmp_path), tmp_path)
