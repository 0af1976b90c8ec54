"""The one Celery worker process both the engine and the raw baselines run on."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import IO

from config.celery import WORKER_QUEUES, app

from .procs import descendants, vm_rss_kib
from .raw_tasks import BENCH_QUEUE

ROOT = Path(__file__).resolve().parent.parent


class WorkerFailed(Exception):
    """The worker did not start, or died."""


class Worker:
    """``celery -A config worker`` (prefork) in its own session, its output in ``log``."""

    def __init__(self, concurrency: int, log: Path) -> None:
        self.concurrency = concurrency
        self.env: dict[str, str] = {}  # on top of the environment (restart)
        self.log_path = log
        self.hostname = f"bench-{uuid.uuid4().hex[:8]}@localhost"
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def queues(self) -> str:
        # The workers' queues, as the Procfile's `worker` (webhooks have their own process).
        return ",".join((*WORKER_QUEUES, BENCH_QUEUE))

    def start(self, timeout: float = 60.0) -> None:
        self._log = self.log_path.open("ab")
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.env}
        self.proc = subprocess.Popen(
            [
                sys.executable, "-m", "celery", "-A", "config", "worker",
                "--queues", self.queues,
                # The raw baselines' tasks; the fleet tool of fan_2000_tool.
                "--include", "bench.raw_tasks,bench.fleet_tools",
                "--concurrency", str(self.concurrency),
                "--pool", "prefork",
                "--hostname", self.hostname,
                "--loglevel", "WARNING",
                "--without-mingle", "--without-gossip",
            ],
            cwd=ROOT,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                raise WorkerFailed(f"worker exited early (code {self.proc.returncode})")
            replies = app.control.ping(destination=[self.hostname], timeout=0.5) or []
            if any(self.hostname in reply for reply in replies):
                self._wait_for_children(deadline)
                return
        raise WorkerFailed(f"worker did not answer a ping within {timeout:g}s")

    def _wait_for_children(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            if len(descendants(self.pid)) >= self.concurrency:
                return
            time.sleep(0.1)

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise WorkerFailed("worker not started")
        return self.proc.pid

    def restart(self, concurrency: int | None = None, **env: str) -> None:
        """Stop and start again with ``concurrency`` children (default: as now) and ``env``
        on top of the environment (a scenario that measures a setting:
        noisy_neighbour_unfair); no ``env``: the environment alone."""
        self.stop()
        if concurrency is not None:
            self.concurrency = concurrency
        self.env = env
        self.start()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def rss_kib(self) -> int:
        """Resident memory of the worker and all its descendants, KiB."""
        return sum(vm_rss_kib(pid) for pid in (self.pid, *descendants(self.pid)))

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM the main process (a warm shutdown; its pool's children would die
        mid-task of their own), SIGKILL the process group after ``timeout``."""
        if self.proc is None:
            return
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # children left behind, if any
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)
        if self._log is not None:
            self._log.close()
            self._log = None

    def log_text(self) -> str:
        if self._log is not None:
            self._log.flush()
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def log_problems(self) -> list[str]:
        """Log lines that report an error (the worker logs at WARNING and above)."""
        markers = ("ERROR", "CRITICAL", "Traceback")
        return [line for line in self.log_text().splitlines() if any(m in line for m in markers)]
