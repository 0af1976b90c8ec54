"""A whole orchestrator stack on this machine, for `make chaos` and `make load`.

Throwaway PostgreSQL and Redis (scripts/local_servers.py) in a temporary directory, then the
real processes, each in its own session: gunicorn (web), Celery workers with distinct
hostnames, the webhooks sender (the Procfile's `webhooks`: a worker of threads on the
webhooks queue alone), and beat. The stack knows how to break itself, for the fault
injector: kill a worker's pool child or the whole worker (restarted at once), restart
Redis with or without its data, restart PostgreSQL (fast shutdown), kill and restart the
web server, run a second beat for a while. Every process and server is stopped by
``close()``.

Stdlib only, plus the project's own virtualenv on PATH for the processes it starts.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# The settings of every process of the stack, unless ``Stack.web_settings_module`` says
# otherwise for the web process.
SETTINGS_MODULE = "config.settings.local"


def _local_servers() -> ModuleType:
    """scripts/local_servers.py, the one place that knows how to run PostgreSQL and Redis."""
    path = ROOT / "scripts" / "local_servers.py"
    spec = importlib.util.spec_from_file_location("_local_servers", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


local_servers = _local_servers()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for(condition: Callable[[], Any], timeout: float, what: str, *, every: float = 0.1) -> Any:
    """Poll another process's observable state every ``every`` seconds until
    ``condition`` returns something truthy, and return it; TimeoutError after
    ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(every)


def parents() -> dict[int, int]:
    """Every live process's parent pid, by pid (from /proc; zombies left out)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        # pid (comm) state ppid ...: comm may contain spaces, so split after its ')'.
        fields = stat.rsplit(")", 1)[1].split()
        if len(fields) > 1 and fields[0] != "Z":
            found[int(entry.name)] = int(fields[1])
    return found


def children_of(pid: int) -> list[int]:
    """Direct children of ``pid``, e.g. a Celery worker's pool processes."""
    return [child for child, parent in parents().items() if parent == pid]


# A worker (re)started this long ago has started its pool (kill_worker_child).
WORKER_BOOT_S = 10.0


@dataclass
class Process:
    """One long-running child in its own session, restartable with the same command."""

    name: str
    args: list[str]
    env: Mapping[str, str]
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0
    started_at: float = 0.0  # monotonic, at its last start

    def start(self) -> None:
        log = self.log_path.open("ab")
        try:
            self.proc = subprocess.Popen(
                self.args,
                cwd=ROOT,
                env=dict(self.env),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        finally:
            log.close()
        self.starts += 1
        self.started_at = time.monotonic()

    @property
    def pid(self) -> int:
        assert self.proc is not None, f"{self.name} was never started"
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL the process and everything in its session, and reap it."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM to the main process (a warm shutdown: a worker finishes the tasks it
        runs, gunicorn its requests), then SIGKILL whatever is left of the session. Not
        SIGTERM to the whole session: a pool's child takes it itself and dies mid-task."""
        if self.alive():
            assert self.proc is not None
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout)
        self.kill()

    def output(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


@dataclass
class Stack:
    """PostgreSQL, Redis, web, workers and beat in ``directory``; see the module doc."""

    directory: Path
    workers: int = 2
    worker_concurrency: int = 2
    web_workers: int = 2
    settings_env: dict[str, str] = field(default_factory=dict)
    # DJANGO_SETTINGS_MODULE of the web process alone, when set (`make load`'s floor
    # URLconf, reliability/load_settings.py); the other processes keep SETTINGS_MODULE.
    web_settings_module: str = ""
    pg_port: int = 0
    redis_port: int = 0
    web_port: int = 0
    database_url: str = ""
    broker_url: str = ""
    processes: dict[str, Process] = field(default_factory=dict)
    # Process changes (kills, restarts, the supervisor's checks) happen one at a time.
    lock: threading.Lock = field(default_factory=threading.Lock)
    unexpected_exits: list[str] = field(default_factory=list)

    # ------------------------------------------------------------------ servers
    def start_servers(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        os.chmod(self.directory, 0o755)  # noqa: S103 - PostgreSQL's account must reach it
        self.pg_port = self.pg_port or free_port()
        self.redis_port = self.redis_port or free_port()
        self.web_port = self.web_port or free_port()
        self.database_url = self._start_postgres()
        self.broker_url = self._start_redis()

    def _start_postgres(self) -> str:
        url: str = local_servers.start_postgres(self.directory, self.pg_port, "orchestrator", True)
        return url

    def _start_redis(self) -> str:
        # Append-only file, fsync every second: what make run and production use, so
        # an orderly Redis restart keeps its queues (docs/reliability.md).
        url: str = local_servers.start_redis(self.directory, self.redis_port, aof=True)
        return url

    @property
    def env(self) -> dict[str, str]:
        """The environment of every process of the stack (and of this harness)."""
        venv_bin = Path(sys.executable).parent
        env = dict(os.environ)
        env.update(
            {
                "DJANGO_SETTINGS_MODULE": SETTINGS_MODULE,
                "DATABASE_URL": self.database_url,
                "CELERY_BROKER_URL": self.broker_url,
                "DJANGO_DEBUG": "false",
                "LOG_FORMAT": "text",
                "LOG_LEVEL": "WARNING",
                "PYTHONUNBUFFERED": "1",
                "PATH": f"{venv_bin}{os.pathsep}{env.get('PATH', '')}",
            }
        )
        env.pop("CELERY_RESULT_BACKEND", None)
        env.update(self.settings_env)
        return env

    def manage(self, *args: str, check: bool = True) -> str:
        result = subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            check=False,
        )
        if check and result.returncode != 0:
            raise RuntimeError(f"manage.py {' '.join(args)} failed:\n{result.stderr}")
        return result.stdout

    def migrate(self) -> None:
        self.manage("migrate", "--noinput", "-v", "0")
        self.manage("setup_periodic_tasks")

    # ------------------------------------------------------------------ processes
    @property
    def web_env(self) -> dict[str, str]:
        """The web process's environment: the stack's, but ``web_settings_module``."""
        env = self.env
        if self.web_settings_module:
            env["DJANGO_SETTINGS_MODULE"] = self.web_settings_module
        return env

    def _process(self, name: str, args: list[str], env: Mapping[str, str] | None = None) -> Process:
        log_path = self.directory / f"{name}.log"
        process = Process(name, args, self.env if env is None else env, log_path)
        self.processes[name] = process
        return process

    def worker_names(self) -> list[str]:
        return [name for name in self.processes if name.startswith("worker-")]

    def start_processes(self) -> None:
        self.start_web()
        for index in range(self.workers):
            letter = "abcdefghij"[index]
            hostname = f"chaos-{letter}@localhost"
            self._process(f"worker-{letter}", self._worker_args(hostname)).start()
        self._process("webhooks", self._webhooks_args()).start()
        self._process("beat", self._beat_args()).start()
        self.wait_healthy()

    def start_web(self) -> None:
        """gunicorn with config/gunicorn.py on ``web_port``, ``web_workers`` processes
        (`make bench`'s many_runs_api starts this alone, on the bench's own stores)."""
        venv_bin = Path(sys.executable).parent
        self._process(
            "web",
            [
                str(venv_bin / "gunicorn"),
                "config.wsgi:application",
                "--config",
                "config/gunicorn.py",
                "--bind",
                f"127.0.0.1:{self.web_port}",
                "--workers",
                str(self.web_workers),
                "--timeout",
                "30",
                "--graceful-timeout",
                "5",
            ],
            self.web_env,
        ).start()

    def _worker_args(self, hostname: str) -> list[str]:
        return [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "config",
            "worker",
            "--queues",
            "runs.high_priority,runs.normal,steps,sweeps",
            "--concurrency",
            str(self.worker_concurrency),
            "--pool",
            "prefork",
            "--hostname",
            hostname,
            "--loglevel",
            "WARNING",
            "--without-mingle",
            "--without-gossip",
        ]

    def _webhooks_args(self) -> list[str]:
        """The Procfile's `webhooks` process: the run webhooks' sweep and sends, never a
        step (docs/webhooks.md)."""
        return [sys.executable, "-m", "celery", "-A", "config", "worker", "--queues", "webhooks",
                "--pool", "threads", "--concurrency", "10", "--hostname", "webhooks@localhost",
                "--loglevel", "WARNING", "--without-mingle", "--without-gossip"]  # fmt: skip

    def _beat_args(self) -> list[str]:
        return [sys.executable, "-m", "celery", "-A", "config", "beat", "--loglevel", "WARNING",
                "--pidfile="]  # fmt: skip

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.web_port}"

    def web_answers(self) -> bool:
        with socket.socket() as sock:
            sock.settimeout(0.5)
            return sock.connect_ex(("127.0.0.1", self.web_port)) == 0

    def wait_healthy(self, timeout: float = 90.0) -> None:
        """Every worker's pool is up and the web server accepts connections."""

        def ready() -> bool:
            for name, process in self.processes.items():
                if not process.alive():
                    raise RuntimeError(f"{name} exited early:\n{process.output()[-3000:]}")
            pools = all(
                len(children_of(self.processes[name].pid)) >= self.worker_concurrency
                for name in self.worker_names()
            )
            return pools and self.web_answers()

        wait_for(ready, timeout, "the web server and the workers' pools")

    def supervise(self, stop: threading.Event) -> None:
        """Restart any process that exited without being told to, as systemd or Kubernetes
        would, and remember it: an exit nobody caused is a finding of the run."""
        while not stop.wait(0.5):
            with self.lock:
                for name, process in self.processes.items():
                    if process.proc is not None and not process.alive():
                        tail = process.output().strip().splitlines()[-1:] or [""]
                        self.unexpected_exits.append(
                            f"{name} exited with {process.proc.returncode}: {tail[0][:200]}"
                        )
                        process.start()

    # ------------------------------------------------------------------ faults
    def kill_worker_child(self, rng: random.Random) -> str:
        """SIGKILL one pool process of a random worker (Celery starts a replacement).

        Not of a worker still booting: a pool process killed before Celery's pool has
        started makes the whole worker exit ("Could not start worker processes"), which
        a supervisor restarts in production but the report counts as an unexpected exit;
        a whole worker killed is a fault of its own (``kill_worker``)."""
        booted = [
            name
            for name in self.worker_names()
            if time.monotonic() - self.processes[name].started_at >= WORKER_BOOT_S
        ]
        if not booted:
            return "not: every worker is starting"
        name = rng.choice(booted)
        pool = children_of(self.processes[name].pid)
        if not pool:
            return f"{name}: no pool process to kill"
        victim = rng.choice(pool)
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim, signal.SIGKILL)
        return f"{name} child {victim}"

    def kill_worker(self, rng: random.Random) -> str:
        """SIGKILL a whole worker (main process and pool) and start it again at once."""
        with self.lock:
            name = rng.choice(self.worker_names())
            process = self.processes[name]
            process.kill()
            process.start()
        return name

    def restart_redis(self, lose_data: bool) -> str:
        """Stop Redis (SIGKILL and its files removed when ``lose_data``), start it again."""
        data = self.directory / "redis"
        pidfile = data / "redis.pid"
        pid = int(pidfile.read_text().strip())
        if lose_data:
            os.kill(pid, signal.SIGKILL)
            wait_for(lambda: not local_servers.running(pid), 10, "Redis to die")
            for item in data.iterdir():
                if item.name not in ("redis.log",):
                    if item.is_dir():
                        shutil.rmtree(item)
                    else:
                        item.unlink()
        else:
            local_servers.stop_redis(self.directory)  # SIGTERM: Redis writes its AOF and exits
        wait_for(lambda: not local_servers.port_open(self.redis_port), 10, "Redis's port to close")
        self._start_redis()
        return "data lost" if lose_data else "data kept"

    def restart_postgres(self, down_seconds: float = 1.0) -> str:
        """`pg_ctl stop -m fast` (every connection is cut), a pause, then start again."""
        local_servers.stop_postgres(self.directory)
        time.sleep(down_seconds)  # the outage itself: clients must see it
        self._start_postgres()
        return f"down {down_seconds:g}s"

    def start_runner(self, api_key: str, script: Path, effect_url: str) -> None:
        """The reference runner (orchestrator_client.runner) against this stack's web, running
        ``script`` for each job, four at a time."""
        args = [
            sys.executable, "-m", "orchestrator_client.runner",
            "--url", f"http://127.0.0.1:{self.web_port}",
            "--api-key", api_key,
            "--command", f"{sys.executable} {script}",
            "--hostname", "chaos-runner",
            "--concurrency", "4",
            "--kill-after", "1",
        ]  # fmt: skip
        env = {**self.env, "ORCH_EFFECT_URL": effect_url}
        with self.lock:
            process = Process("runner", args, env, self.directory / "runner.log")
            self.processes["runner"] = process
            process.start()

    def start_worker(self, api_key: str, effect_url: str) -> None:
        """An `orch worker` (docs/tools.md) serving reliability/chaos_worker_tools.py against
        this stack's web, four jobs at a time."""
        orch = str(Path(sys.executable).parent / "orch")
        args = [orch, "worker", "reliability.chaos_worker_tools", "--hostname", "chaos-worker",
                "--concurrency", "4", "--grace-period", "1"]  # fmt: skip
        env = {
            **self.env,
            "ORCH_URL": f"http://127.0.0.1:{self.web_port}",
            "ORCH_API_KEY": api_key,
            "ORCH_EFFECT_URL": effect_url,
        }
        with self.lock:
            process = Process("worker_tools", args, env, self.directory / "orch-worker.log")
            self.processes["worker_tools"] = process
            process.start()

    def kill_runner(self) -> str:
        """SIGKILL the runner (its jobs' processes live on in their own sessions) and the
        `orch worker`, and start them again: each registers anew once its old
        registration goes stale."""
        with self.lock:
            for name in ("runner", "worker_tools"):
                process = self.processes.get(name)
                if process is not None:
                    process.kill()
                    process.start()
        return "killed and restarted"

    def restart_web(self) -> str:
        with self.lock:
            process = self.processes["web"]
            process.kill()
            process.start()
        return "killed and restarted"

    def start_second_beat(self) -> str:
        with self.lock:
            self._process("beat-2", self._beat_args()).start()
        return "started"

    def stop_second_beat(self) -> str:
        with self.lock:
            process = self.processes.pop("beat-2", None)
            if process is not None:
                process.stop(timeout=5)
        return "stopped"

    # ------------------------------------------------------------------ teardown
    def stop_processes(self) -> None:
        with self.lock:
            for process in self.processes.values():
                process.stop(timeout=10)

    def close(self) -> None:
        try:
            self.stop_processes()
        finally:
            local_servers.stop_postgres(self.directory)
            local_servers.stop_redis(self.directory)
