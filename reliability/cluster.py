"""`make cluster` / `make cluster-down` (``python -m reliability.cluster up|down|status``):
the whole stack as separate hosts on one machine, each host a Linux network namespace.

Fourteen hosts, joined by one bridge (``orchbr0``) that is attached to no physical
interface, addressed from 198.18.0.0/24 (RFC 2544's benchmarking range: nothing real is
ever there), with no default route in any namespace, so a process can reach the other
hosts and nothing else:

    db1 .11 (PostgreSQL primary)   db2 .12 (its synchronous streaming replica)
    redis1 .21 (Redis primary)     redis2 .22 (its replica)
    sentinel1-3 .31-.33 (Redis Sentinels, quorum 2)
    web1-2 .41-.42 (gunicorn)      worker1-3 .51-.53 (Celery: a worker and a webhooks sender)
    beat .61 (beat, and a worker for the sweeps alone)
    runner .71 (the reference runner)

The harness itself is the bridge's address, 198.18.0.1, in the machine's own namespace:
it migrates, creates the organization and talks to the web hosts as a client would.
Every process is configured by URLs and environment only: ``DATABASE_URL`` names db1 and
db2 (libpq's multi-host form, ``target_session_attrs=read-write``) and
``CELERY_BROKER_URL`` the three Sentinels (docs/architecture.md, "Across hosts"), so
nothing assumes localhost.

A preflight refuses to start unless all of that can hold: root, ``ip`` and network
namespaces working, no address or route of 198.18.0.0/15 already on the machine, no
leftover of an earlier cluster; after the network is made, it checks again that no
namespace has a default route and that the bridge has only the hosts' links.

``up`` starts everything, waits for every host to answer, and proves the cluster with
runs submitted through each web host (one with a step for the runner host) before it
returns; the cluster stays up until ``down``, which kills every process it started and
removes every namespace and link (also after a failed ``up``). ``up --check`` does
``up``, then ``down``. State (pids, logs, data) lives in ``CLUSTER_DIR``
(/tmp/orchestrator-cluster).

Partitions (for the network faults to come): a route of type ``blackhole`` in a
namespace towards one address cuts that host off from it (``partition``/``heal``);
setting a host's link down cuts it off from everything. nftables is not installed here;
routes need nothing beyond iproute2.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import redis

from reliability.stack import ROOT, local_servers, wait_for

NET = "198.18.0"
BRIDGE = "orchbr0"
PREFIX = "orch-"
HARNESS = f"{NET}.1"
HOSTS = {
    "db1": 11,
    "db2": 12,
    "redis1": 21,
    "redis2": 22,
    "sentinel1": 31,
    "sentinel2": 32,
    "sentinel3": 33,
    "web1": 41,
    "web2": 42,
    "worker1": 51,
    "worker2": 52,
    "worker3": 53,
    "beat": 61,
    "runner": 71,
}
PG_PORT, REDIS_PORT, SENTINEL_PORT, WEB_PORT = 5432, 6379, 26379, 8000
MASTER = "orchestrator"
DB_NAME = "orchestrator"
DEFAULT_DIR = Path(
    os.environ.get("CLUSTER_DIR") or Path(tempfile.gettempdir()) / "orchestrator-cluster"
)


def address(host: str) -> str:
    return f"{NET}.{HOSTS[host]}"


def namespace(host: str) -> str:
    return f"{PREFIX}{host}"


class ClusterError(RuntimeError):
    """What stops the cluster from starting, said plainly."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if check and result.returncode != 0:
        raise ClusterError(f"ip {' '.join(args)}: {result.stderr.strip()}")
    return result


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _answers(host: str, port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((address(host), port)) == 0


# --------------------------------------------------------------------------- the network
def preflight() -> None:
    """Refuse to start unless the isolation the cluster promises can hold."""
    if os.geteuid() != 0:
        raise ClusterError("the cluster needs root (network namespaces, a bridge)")
    if shutil.which("ip") is None:
        raise ClusterError("iproute2's ip is missing (apt-get install iproute2)")
    for name in ("redis-server", "gunicorn"):
        if shutil.which(name) is None and not (Path(sys.executable).parent / name).exists():
            raise ClusterError(f"{name} is missing: run make install")
    leftovers = [ns for ns in _namespaces() if ns.startswith(PREFIX)] + _host_links()
    if leftovers or _ip("link", "show", BRIDGE, check=False).returncode == 0:
        raise ClusterError(
            f"an earlier cluster is still there ({', '.join(leftovers) or BRIDGE}): "
            "make cluster-down first"
        )
    taken = [
        line
        for kind in ("addr", "route")
        for line in _ip("-4", kind, "show").stdout.splitlines()
        if " 198.18." in f" {line}" or " 198.19." in f" {line}"
    ]
    if taken:
        raise ClusterError(f"198.18.0.0/15 is already in use on this machine: {taken[0]}")
    probe = f"{PREFIX}probe"
    _ip("netns", "add", probe)
    try:
        _ip("-n", probe, "link", "set", "lo", "up")
    finally:
        _ip("netns", "del", probe, check=False)


def _namespaces() -> list[str]:
    return [line.split()[0] for line in _ip("netns", "list").stdout.splitlines() if line]


def make_network() -> None:
    _ip("link", "add", BRIDGE, "type", "bridge")
    _ip("addr", "add", f"{HARNESS}/24", "dev", BRIDGE)
    _ip("link", "set", BRIDGE, "up")
    for host in HOSTS:
        ns, link = namespace(host), f"ob-{host}"
        _ip("netns", "add", ns)
        _ip("link", "add", link, "type", "veth", "peer", "name", "eth0", "netns", ns)
        _ip("link", "set", link, "master", BRIDGE)
        _ip("link", "set", link, "up")
        _ip("-n", ns, "addr", "add", f"{address(host)}/24", "dev", "eth0")
        _ip("-n", ns, "link", "set", "eth0", "up")
        _ip("-n", ns, "link", "set", "lo", "up")
    check_network()


def check_network() -> None:
    """No namespace can reach beyond the cluster; the bridge holds the hosts' links only."""
    for host in HOSTS:
        routes = _ip("-n", namespace(host), "route", "show", "default").stdout.strip()
        if routes:
            raise ClusterError(f"{host} has a default route ({routes}): refusing to go on")
    ports = {
        line.split(":")[1].strip().split("@")[0]
        for line in _ip("-o", "link", "show", "master", BRIDGE).stdout.splitlines()
    }
    expected = {f"ob-{host}" for host in HOSTS}
    if ports != expected:
        raise ClusterError(f"the bridge holds other links: {sorted(ports - expected)}")


def remove_network() -> None:
    for ns in _namespaces():
        if ns.startswith(PREFIX):
            _ip("netns", "del", ns, check=False)
    # A deleted namespace goes when its last reference does (the kernel frees it
    # later): its link's end here is deleted now, which takes the pair with it.
    for link in _host_links():
        _ip("link", "del", link, check=False)
    _ip("link", "del", BRIDGE, check=False)


def _host_links() -> list[str]:
    """The hosts' links' ends in the machine's own namespace (``ob-<host>``)."""
    names = [
        line.split(":")[1].strip().split("@")[0]
        for line in _ip("-o", "link", "show").stdout.splitlines()
    ]
    return [name for name in names if name.startswith("ob-")]


def partition(host: str, *others: str) -> None:
    """Cut ``host`` off from ``others`` both ways (blackhole routes)."""
    for other in others:
        _ip("-n", namespace(host), "route", "replace", "blackhole", f"{address(other)}/32")
        _ip("-n", namespace(other), "route", "replace", "blackhole", f"{address(host)}/32")


def cut(host: str) -> None:
    """``host`` cut off from everything (its link down); its processes go on."""
    _ip("-n", namespace(host), "link", "set", "eth0", "down")


def uncut(host: str) -> None:
    _ip("-n", namespace(host), "link", "set", "eth0", "up")


def heal(host: str, *others: str) -> None:
    for other in others:
        _ip("-n", namespace(host), "route", "del", "blackhole", f"{address(other)}/32", check=False)
        _ip("-n", namespace(other), "route", "del", "blackhole", f"{address(host)}/32", check=False)


# --------------------------------------------------------------------------- processes
@dataclass
class Cluster:
    directory: Path
    # Settings every app process gets on top of app_env's (make chaos-net's short leases).
    settings_env: dict[str, str] = field(default_factory=dict)
    # name -> (host, args, env) of what this object started, so a lost host's processes
    # can be started again as they were.
    launched: dict[str, tuple[str, list[str], dict[str, str]]] = field(default_factory=dict)

    @property
    def state_file(self) -> Path:
        return self.directory / "state.json"

    def _state(self) -> dict[str, Any]:
        if self.state_file.exists():
            state: dict[str, Any] = json.loads(self.state_file.read_text())
            return state
        return {"processes": {}}

    def _save(self, state: dict[str, Any]) -> None:
        self.state_file.write_text(json.dumps(state, indent=2))

    def start(self, name: str, host: str, args: list[str], env: dict[str, str]) -> int:
        """``args`` in ``host``'s namespace, in a session of its own, logged to
        ``name``.log; its pid is recorded for ``down``."""
        log = (self.directory / f"{name}.log").open("ab")
        process = subprocess.Popen(
            ["ip", "netns", "exec", namespace(host), *args],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        state = self._state()
        state["processes"][name] = {"pid": process.pid, "host": host}
        self._save(state)
        self.launched[name] = (host, args, env)
        return process.pid

    def restart(self, name: str, *extra: str) -> int:
        """``name`` started again on its host as it was first started (plus ``extra``)."""
        host, args, env = self.launched[name]
        return self.start(name, host, [*args, *extra], env)

    def alive(self, name: str) -> bool:
        pid = self._state()["processes"].get(name, {}).get("pid")
        return pid is not None and local_servers.running(int(pid))

    def stop_all(self) -> None:
        state = self._state()
        for entry in state["processes"].values():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(int(entry["pid"]), signal.SIGKILL)
        state["processes"] = {}
        self._save(state)

    # ------------------------------------------------------------------ the stores
    @property
    def database_url(self) -> str:
        hosts = ",".join(f"{address(h)}:{PG_PORT}" for h in ("db1", "db2"))
        # connect_timeout is per host: a lost db1 costs a new connection 2 s, then db2.
        return (
            f"postgres://{local_servers.PG_USER}@{hosts}/{DB_NAME}"
            "?target_session_attrs=read-write&connect_timeout=2"
        )

    @property
    def broker_url(self) -> str:
        return ";".join(
            f"sentinel://{address(h)}:{SENTINEL_PORT}/0"
            for h in ("sentinel1", "sentinel2", "sentinel3")
        )

    def _pg_data(self, host: str) -> Path:
        return self.directory / host / "postgres"

    def _as_pg(self, args: list[str]) -> list[str]:
        wrapped: list[str] = local_servers.as_server_user(args)
        return wrapped

    def _postgres_args(self, host: str, *extra: str) -> list[str]:
        return self._as_pg(
            [
                local_servers.pg_bin("postgres"),
                "-D", str(self._pg_data(host)),
                "-c", f"listen_addresses={address(host)}",
                "-p", str(PG_PORT),
                # No Unix socket: TCP on the host's address only (a socket's lock file
                # in the data directory would be copied to the replica with it).
                "-c", "unix_socket_directories=",
                "-c", "max_connections=300",
                "-c", "wal_level=replica",
                "-c", "hot_standby=on",
                "-c", f"cluster_name={host}",
                *extra,
            ]
        )  # fmt: skip

    def start_postgres(self) -> None:
        data = self._pg_data("db1")
        data.parent.mkdir(parents=True)
        for path in (self.directory, data.parent):
            os.chmod(path, 0o755)  # noqa: S103 - PostgreSQL's account must reach its data
        data.mkdir()
        local_servers.chown_for_server(data)
        os.chmod(data, 0o700)
        subprocess.run(
            self._as_pg(
                [local_servers.pg_bin("initdb"), "-D", str(data), "-U", local_servers.PG_USER,
                 "--auth=trust", "--encoding=UTF8", "--no-instructions"]
            ),
            check=True,
            stdout=subprocess.DEVNULL,
        )  # fmt: skip
        with (data / "pg_hba.conf").open("a") as hba:
            hba.write(f"host all all {NET}.0/24 trust\nhost replication all {NET}.0/24 trust\n")
        env = dict(os.environ)
        self.start("db1", "db1", self._postgres_args("db1"), env)
        wait_for(lambda: _answers("db1", PG_PORT), 60, "PostgreSQL on db1")
        subprocess.run(
            [local_servers.pg_bin("psql"), "-h", address("db1"), "-U", local_servers.PG_USER,
             "-d", "postgres", "-qc", f'CREATE DATABASE "{DB_NAME}"'],
            check=True,
        )  # fmt: skip
        self.make_replica("db2", "db1")

    def make_replica(self, host: str, primary: str) -> None:
        """``host``'s PostgreSQL made anew as a streaming replica of ``primary`` (from a
        base backup taken inside ``host``'s namespace), then ``primary`` synchronous: a
        commit is acknowledged once the replica has it."""
        data = self._pg_data(host)
        if data.exists():
            shutil.rmtree(data)  # an old primary's data: rebuilt, never rejoined as is
        data.parent.mkdir(parents=True, exist_ok=True)
        os.chmod(data.parent, 0o755)  # noqa: S103 - PostgreSQL's account must reach it
        data.mkdir()
        local_servers.chown_for_server(data)
        os.chmod(data, 0o700)
        subprocess.run(
            ["ip", "netns", "exec", namespace(host), *self._as_pg(
                [local_servers.pg_bin("pg_basebackup"), "-h", address(primary), "-p", str(PG_PORT),
                 "-U", local_servers.PG_USER, "-D", str(data), "-R", "-X", "stream", "-c", "fast"]
            )],
            check=True,
            stdout=subprocess.DEVNULL,
        )  # fmt: skip
        self.start(host, host, self._postgres_args(host), dict(os.environ))
        wait_for(lambda: _answers(host, PG_PORT), 60, f"PostgreSQL on {host}")
        self._psql(primary, "ALTER SYSTEM SET synchronous_standby_names = '*'")
        self._psql(primary, "SELECT pg_reload_conf()")
        wait_for(
            lambda: (
                self._psql(
                    primary,
                    "SELECT host(client_addr) FROM pg_stat_replication WHERE sync_state = 'sync'",
                ).strip()
                == address(host)
            ),
            60,
            f"{host} streaming synchronously from {primary}",
        )

    def processes_on(self, host: str) -> list[str]:
        return [n for n, entry in self._state()["processes"].items() if entry["host"] == host]

    def lose_host(self, host: str) -> None:
        """``host`` gone at once: its link down, every process in its namespace SIGKILLed
        (a runner's jobs too, which live in sessions of their own)."""
        cut(host)
        for name in self.processes_on(host):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(int(self._state()["processes"][name]["pid"]), signal.SIGKILL)
        for pid in _ip("netns", "pids", namespace(host)).stdout.split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)

    def restore_link(self, host: str) -> None:
        uncut(host)

    def bring_back(self, host: str) -> list[str]:
        """A lost app host back (a machine rebooted): its link up, its processes started
        again as they were. Not for the stores' hosts, which come back as replicas."""
        self.restore_link(host)
        names = self.processes_on(host)
        for name in names:
            self.restart(name)
        return names

    @property
    def db_primary(self) -> str:
        return str(self._state().get("db_primary", "db1"))

    def lose_db_primary(self) -> tuple[str, str]:
        """The primary's host lost (its link down, its PostgreSQL killed at once), then
        the replica promoted, as a failover manager would: the clients' multi-host URL
        finds it. The new primary runs alone until ``rebuild_db`` (its configuration has
        no synchronous standby). Returns (lost, promoted)."""
        lost = self.db_primary
        promoted = "db2" if lost == "db1" else "db1"
        self.lose_host(lost)
        pg_ctl = local_servers.pg_bin("pg_ctl")
        subprocess.run(
            ["ip", "netns", "exec", namespace(promoted), *self._as_pg(
                [pg_ctl, "-D", str(self._pg_data(promoted)), "-w", "promote"]
            )],
            check=True,
            stdout=subprocess.DEVNULL,
        )  # fmt: skip
        state = self._state()
        state["db_primary"] = promoted
        self._save(state)
        return lost, promoted

    def rebuild_db(self, host: str) -> None:
        """A lost primary's host back as the new primary's synchronous replica (its old
        data thrown away: it may hold commits the promoted replica never had)."""
        self.restore_link(host)
        self.make_replica(host, self.db_primary)

    def redis_primary(self) -> str:
        """The host the Sentinels name as the primary now ("" while none answers)."""
        for sentinel in ("sentinel1", "sentinel2", "sentinel3"):
            try:
                client = redis.Redis(host=address(sentinel), port=SENTINEL_PORT, socket_timeout=1)
                found = str(client.info("sentinel")["master0"]["address"]).split(":")[0]
            except (redis.RedisError, KeyError, OSError):
                continue
            return next((h for h in ("redis1", "redis2") if address(h) == found), "")
        return ""

    def lose_redis_primary(self) -> str:
        """The Redis primary's host lost; returns it (``redis_promoted`` waits for the
        Sentinels to name another)."""
        lost = self.redis_primary()
        self.lose_host(lost)
        return lost

    def redis_promoted(self, lost: str, timeout: float = 60.0) -> str:
        promoted = wait_for(
            lambda: found if (found := self.redis_primary()) not in ("", lost) else None,
            timeout,
            f"the Sentinels replacing {lost}",
        )
        return str(promoted)

    def rejoin_redis(self, host: str) -> None:
        """A lost Redis primary's host back as the new primary's replica (the Sentinels
        would reconfigure it too; saying so at start leaves no moment as a second
        primary)."""
        self.restore_link(host)
        primary = self.redis_primary()
        self.restart(host, "--replicaof", address(primary), str(REDIS_PORT))
        wait_for(partial(_answers, host, REDIS_PORT), 30, f"Redis on {host}")

    def _psql(self, host: str, sql: str) -> str:
        return subprocess.run(
            [local_servers.pg_bin("psql"), "-h", address(host), "-p", str(PG_PORT),
             "-U", local_servers.PG_USER, "-d", DB_NAME, "-tAc", sql],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip

    def start_redis(self) -> None:
        server = shutil.which("redis-server") or "redis-server"
        env = dict(os.environ)
        for host in ("redis1", "redis2"):
            data = self.directory / host
            data.mkdir()
            args = [server, "--bind", address(host), "--port", str(REDIS_PORT),
                    "--protected-mode", "no", "--dir", str(data), "--save", "",
                    "--appendonly", "yes", "--appendfsync", "everysec"]  # fmt: skip
            if host == "redis2":
                args += ["--replicaof", address("redis1"), str(REDIS_PORT)]
            self.start(host, host, args, env)
            wait_for(partial(_answers, host, REDIS_PORT), 30, f"Redis on {host}")
        for host in ("sentinel1", "sentinel2", "sentinel3"):
            conf = self.directory / f"{host}.conf"
            conf.write_text(
                f"bind {address(host)}\nport {SENTINEL_PORT}\nprotected-mode no\n"
                f"dir {self.directory}\n"
                f"sentinel monitor {MASTER} {address('redis1')} {REDIS_PORT} 2\n"
                f"sentinel down-after-milliseconds {MASTER} 2000\n"
                f"sentinel failover-timeout {MASTER} 10000\n"
                f"sentinel parallel-syncs {MASTER} 1\n"
            )
            self.start(host, host, [server, str(conf), "--sentinel"], env)
            wait_for(partial(_answers, host, SENTINEL_PORT), 30, f"Sentinel on {host}")

    # ------------------------------------------------------------------ the app
    def app_env(self) -> dict[str, str]:
        env = self._base_env()
        env.update(self.settings_env)
        return env

    def _base_env(self) -> dict[str, str]:
        venv_bin = Path(sys.executable).parent
        env = {key: value for key, value in os.environ.items() if not key.startswith("CELERY_")}
        env.update(
            {
                "DJANGO_SETTINGS_MODULE": "config.settings.local",
                "DJANGO_DEBUG": "false",
                "DATABASE_URL": self.database_url,
                "CELERY_BROKER_URL": self.broker_url,
                "REDIS_SENTINEL_MASTER": MASTER,
                "ALLOWED_HOSTS": ",".join(address(h) for h in ("web1", "web2")),
                "LOG_FORMAT": "text",
                "LOG_LEVEL": "WARNING",
                "PYTHONUNBUFFERED": "1",
                "PATH": f"{venv_bin}{os.pathsep}{os.environ.get('PATH', '')}",
            }
        )
        env.pop("DATABASE_POOL_SIZE", None)
        return env

    def manage(self, *args: str) -> str:
        result = subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=ROOT,
            env=self.app_env(),
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            raise ClusterError(f"manage.py {' '.join(args)} failed:\n{result.stderr}")
        return result.stdout

    def start_app(self) -> None:
        """Migrate, then web, workers and beat on their hosts (the runner apart:
        ``start_runner``)."""
        self.manage("migrate", "--noinput", "-v", "0")
        self.manage("setup_periodic_tasks")
        env, py = self.app_env(), sys.executable
        venv_bin = Path(py).parent
        for host in ("web1", "web2"):
            self.start(
                host,
                host,
                [str(venv_bin / "gunicorn"), "config.wsgi:application",
                 "--config", "config/gunicorn.py", "--bind", f"{address(host)}:{WEB_PORT}",
                 "--workers", "2", "--timeout", "30"],
                env,
            )  # fmt: skip
        for host in ("worker1", "worker2", "worker3"):
            self.start(
                host,
                host,
                [py, "-m", "celery", "-A", "config", "worker",
                 "--queues", "runs.high_priority,runs.normal,steps,sweeps",
                 "--concurrency", "2", "--pool", "prefork", "--hostname", f"{host}@{host}",
                 "--loglevel", "WARNING", "--without-mingle", "--without-gossip"],
                env,
            )  # fmt: skip
            # Each worker host sends webhooks too, in a process of its own (the Procfile's
            # `webhooks`): a host lost or cut off leaves two senders, and its claims'
            # leases end for them.
            self.start(
                f"{host}-webhooks",
                host,
                [py, "-m", "celery", "-A", "config", "worker", "--queues", "webhooks",
                 "--pool", "threads", "--concurrency", "10",
                 "--hostname", f"webhooks@{host}",
                 "--loglevel", "WARNING", "--without-mingle", "--without-gossip"],
                env,
            )  # fmt: skip
        self.start("beat", "beat", [py, "-m", "celery", "-A", "config", "beat",
                                    "--loglevel", "WARNING", "--pidfile="], env)  # fmt: skip
        # The sweeps on a process of their own: when every worker slot holds a long tool,
        # a lost host's leases are still reclaimed (the workers take sweeps too, so
        # losing this host loses no sweep).
        self.start(
            "sweeper",
            "beat",
            [py, "-m", "celery", "-A", "config", "worker", "--queues", "sweeps",
             "--concurrency", "1", "--pool", "prefork", "--hostname", "sweeper@beat",
             "--loglevel", "WARNING", "--without-mingle", "--without-gossip"],
            env,
        )  # fmt: skip
        for host in ("web1", "web2"):
            wait_for(partial(_answers, host, WEB_PORT), 90, f"gunicorn on {host}")

    def create_org(self, name: str, credits: int) -> dict[str, str]:
        org: dict[str, str] = json.loads(self.manage("create_org", name, "--credits", str(credits)))
        return org

    def start_runner(self, org: str, command: str, *extra: str, env: dict[str, str]) -> None:
        """The reference runner on the runner host, for ``org`` (a key of its own), its
        jobs running ``command``; it polls web2 (web1 would do as well)."""
        runner_key = json.loads(self.manage("create_api_key", org, "--scope", "runner"))
        self.start(
            "runner",
            "runner",
            [sys.executable, "-m", "orchestrator_client.runner",
             "--url", f"http://{address('web2')}:{WEB_PORT}",
             "--api-key", runner_key["api_key"], "--command", command,
             "--hostname", "runner", *extra],
            {**self.app_env(), "ORCH_LOG_LEVEL": "WARNING", **env},
        )  # fmt: skip


# --------------------------------------------------------------------------- proof
def _api(host: str, key: str, method: str, path: str, body: Any = None) -> Any:
    """One API call as a careful client makes it: a 502/503/504 or a refused connection
    (a store failing over behind the web host) is tried again for up to a minute, under
    the same Idempotency-Key, so a POST applies once."""
    headers = {
        "Authorization": f"Bearer {key}",
        "Content-Type": "application/json",
        "Idempotency-Key": str(uuid.uuid4()),
    }
    data = None if body is None else json.dumps(body).encode()
    deadline = time.monotonic() + 60
    while True:
        request = urllib.request.Request(
            f"http://{address(host)}:{WEB_PORT}/api/v1{path}", data, headers, method=method
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310
                return json.loads(response.read() or b"null")
        except urllib.error.HTTPError as exc:
            if exc.code not in (502, 503, 504) or time.monotonic() > deadline:
                raise
        except (urllib.error.URLError, TimeoutError, ConnectionError):
            if time.monotonic() > deadline:
                raise
        time.sleep(0.5)  # a client's backoff between tries, not a synchronisation


def _finished(host: str, key: str, run_id: str) -> dict[str, Any] | None:
    """The run, once it has ended; None while it goes on."""
    found: dict[str, Any] = _api(host, key, "GET", f"/runs/{run_id}?exclude=plan")
    return found if found["status"] in ("completed", "failed", "cancelled") else None


def smoke(org: dict[str, str], timeout: float = 120.0) -> list[str]:
    """A run through each web host, the second with a step for the runner host; each
    must complete. Returns what each did, for the report."""
    key, lines = org["api_key"], []
    for host, runner in (("web1", False), ("web2", True)):
        steps: list[dict[str, Any]] = [
            {"name": "a", "tool": "echo", "params": {"from": host}},
            {"name": "b", "tool": "noop"},
        ]
        if runner:
            steps.append(
                {"name": "elsewhere", "tool": "runner", "timeout": "1m",
                 "params": {"prompt": "prove the runner host"}}
            )  # fmt: skip
        plan = {"name": f"cluster smoke via {host}",
                "agents": [{"name": "g", "tasks": [{"name": "t", "steps": steps}]}]}  # fmt: skip
        started = time.monotonic()
        run = _api(host, key, "POST", "/runs", {"plan": plan, "start": True})
        done = wait_for(
            partial(_finished, host, key, run["id"]),
            timeout,
            f"the run through {host}",
        )
        if done["status"] != "completed":
            raise ClusterError(f"the run through {host} ended {done['status']}: {done}")
        lines.append(
            f"run {run['id']} through {host}: completed in {time.monotonic() - started:.1f} s"
            + (f", output of the runner host's job: {done['outputs'].get('g.t.elsewhere')}"
               if runner else "")
        )  # fmt: skip
    return lines


def build(directory: Path, settings_env: dict[str, str] | None = None) -> Cluster:
    """The network, the stores and the app (web, workers, beat; no runner yet) in a new
    ``directory``; ``settings_env`` on top of every app process's settings."""
    preflight()
    directory.mkdir(parents=True)
    cluster = Cluster(directory, settings_env=dict(settings_env or {}))
    cluster._save({"processes": {}})
    make_network()
    _say(f"==> network: {len(HOSTS)} namespaces on {BRIDGE}, {NET}.0/24, no default route")
    cluster.start_postgres()
    _say("==> PostgreSQL: db1 primary, db2 synchronous replica")
    cluster.start_redis()
    _say("==> Redis: redis1 primary, redis2 replica, three Sentinels")
    cluster.start_app()
    _say("==> web1, web2, worker1-3 (workers, webhook senders), beat started")
    return cluster


def up(directory: Path) -> list[str]:
    cluster = build(directory)
    org = cluster.create_org("cluster", 100000)
    py = sys.executable
    cluster.start_runner("cluster", f'{py} -c "print(\'{{\\"ran\\": true}}\')"', env={})
    _say("==> runner started")
    report = [
        f"cluster up in {directory}: {', '.join(f'{h} {address(h)}' for h in HOSTS)}",
        f"DATABASE_URL={cluster.database_url}",
        f"CELERY_BROKER_URL={cluster.broker_url} (REDIS_SENTINEL_MASTER={MASTER})",
        *smoke(org),
    ]
    (directory / "organization.json").write_text(json.dumps(org))
    return report


def down(directory: Path) -> None:
    if (directory / "state.json").exists():
        Cluster(directory).stop_all()
    remove_network()
    if directory.exists():
        shutil.rmtree(directory, ignore_errors=True)


def status(directory: Path) -> list[str]:
    cluster = Cluster(directory)
    lines = []
    for name, entry in cluster._state()["processes"].items():
        state = "up" if cluster.alive(name) else "gone"
        lines.append(f"{name:10} {entry['host']:10} pid {entry['pid']:>7} {state}")
    return lines or ["no cluster"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m reliability.cluster", description=(__doc__ or "").split("\n")[0]
    )
    parser.add_argument("action", choices=("up", "down", "status"))
    parser.add_argument("--check", action="store_true", help="up, prove it, then down")
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR)
    args = parser.parse_args(argv)
    if args.action == "down":
        down(args.dir)
        _say("==> cluster removed")
        return 0
    if args.action == "status":
        print("\n".join(status(args.dir)))
        return 0
    try:
        report = up(args.dir)
    except (ClusterError, subprocess.CalledProcessError, OSError) as exc:
        _say(f"cluster: FAILED: {exc}")
        for log in sorted(args.dir.glob("*.log")) if args.dir.exists() else []:
            tail = log.read_text(errors="replace").strip().splitlines()[-5:]
            _say(f"--- {log.name}\n" + "\n".join(tail))
        if not isinstance(exc, ClusterError) or "make cluster-down first" not in str(exc):
            down(args.dir)  # a failed start leaves nothing behind
        return 1
    print("\n".join(report))
    if args.check:
        down(args.dir)
        print("cluster removed (--check)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
