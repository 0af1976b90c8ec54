"""Helpers for tests that run real processes: free ports, waiting on conditions, children."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar

from django.conf import settings

# The stack's helpers, owned by reliability/stack.py (stdlib only, which make chaos and
# make load run outside the suite) and shared with the tests.
from reliability.stack import free_port as free_port
from reliability.stack import wait_for

ROOT = Path(__file__).resolve().parent.parent
T = TypeVar("T")


def wait_until(
    condition: Callable[[], T | None], *, timeout: float = 30.0, what: str = "condition"
) -> T:
    """Poll ``condition`` until it returns something truthy; fail the test after
    ``timeout`` (``reliability.stack.wait_for``, every 50 ms).

    Used only to wait for another process to reach a state we can observe (a port open,
    a row written); never as a stand-in for ordering inside the test process.
    """
    try:
        result: T = wait_for(condition, timeout, what, every=0.05)
    except TimeoutError as exc:
        raise AssertionError(str(exc)) from None
    return result


def shared_database_url() -> str:
    """URL of the database pytest-django created, for worker processes to share."""
    db = settings.DATABASES["default"]
    password = f":{db['PASSWORD']}" if db.get("PASSWORD") else ""
    return f"postgres://{db['USER']}{password}@{db['HOST']}:{db['PORT']}/{db['NAME']}"


def child_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "DJANGO_SETTINGS_MODULE": "config.settings.test",
            "DATABASE_URL": shared_database_url(),
            "CELERY_BROKER_URL": settings.CELERY_BROKER_URL,
            "PYTHONUNBUFFERED": "1",
            # The virtualenv's tools (celery, gunicorn, honcho) for scripts and Procfile.
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        }
    )
    env.pop("CELERY_RESULT_BACKEND", None)
    env.update(extra)
    return env


def tracing_env(endpoint: str, service: str = "orchestrator-test-worker") -> dict[str, str]:
    """OTEL_* for a child process that exports its spans to ``endpoint`` (a collector on
    the loopback), often enough for a test to wait tenths of a second for them."""
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
        "OTEL_SERVICE_NAME": service,
        "OTEL_BSP_SCHEDULE_DELAY": "100",
    }


class Child:
    """A child process in its own session, so that stopping it stops its descendants."""

    def __init__(self, args: list[str], env: Mapping[str, str], log: Path) -> None:
        self.log_path = log
        self._log = log.open("wb")
        self.proc = subprocess.Popen(
            args,
            cwd=ROOT,
            env=dict(env),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def output(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def stop(
        self, sig: int = signal.SIGTERM, timeout: float = 30.0, *, leader_only: bool = False
    ) -> int:
        """Signal the group (or with ``leader_only`` its first process alone), wait, then
        SIGKILL the group. A Celery worker's warm shutdown is SIGTERM to its main process
        only: the pool's children take SIGTERM's default and die mid-task, between a
        commit and the message it sends."""
        if self.alive():
            if leader_only:
                os.kill(self.proc.pid, sig)
            else:
                os.killpg(self.proc.pid, sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self._log.close()
        return int(self.proc.returncode)

    def kill_group(self) -> None:
        """SIGKILL every process left in the group (teardown safety net)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)


def python_cmd(*args: str) -> list[str]:
    return [sys.executable, *args]


def worker_cmd(hostname: str, queues: str, concurrency: int = 2) -> list[str]:
    """A real Celery worker (prefork) on ``queues``, as the tests start one."""
    return python_cmd(
        "-m", "celery", "-A", "config", "worker",
        "--queues", queues,
        "--concurrency", str(concurrency),
        "--pool", "prefork",
        "--hostname", hostname,
        "--loglevel", "INFO",
        "--without-mingle", "--without-gossip",
    )  # fmt: skip


def processes_with_env(marker: str) -> list[int]:
    """Pids of live processes whose environment contains ``marker`` (reads /proc)."""
    found = []
    needle = marker.encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle in (entry / "environ").read_bytes():
                status = (entry / "status").read_text()
                if "State:\tZ" not in status:  # zombies are gone, just not reaped
                    found.append(int(entry.name))
        except (FileNotFoundError, PermissionError, ProcessLookupError):
            continue
    return found
