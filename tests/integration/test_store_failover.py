"""The stores' failover, with real servers on the loopback (docs/architecture.md,
"Across hosts"): Redis behind three Sentinels loses its primary and the project's clients,
kombu and a real worker follow the promoted replica; PostgreSQL given as several hosts
is reached at the one that accepts writes.

The primary is killed with SIGKILL (no goodbye to anyone) after the write the test relies
on has reached the replica (``WAIT``): Redis replicates asynchronously, and what a
failover may lose is documented in docs/reliability.md.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
import redis
from django.conf import settings
from django.db.backends.postgresql.base import DatabaseWrapper
from kombu import Connection

from common.stores import celery_sentinel_options, redis_client
from config.settings.database import database_config
from tests.support import Child, child_env, free_port, python_cmd, wait_until

pytestmark = pytest.mark.integration

MASTER = "orchestrator-test"
REDIS_ERRORS = (redis.ConnectionError, redis.TimeoutError, redis.ReadOnlyError)


def _redis_server(*args: str, log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        ["redis-server", *args], stdout=log.open("wb"), stderr=subprocess.STDOUT
    )


@dataclass
class RedisGroup:
    """A primary, its replica and three Sentinels watching them."""

    primary_port: int
    replica_port: int
    sentinel_ports: list[int]
    processes: dict[str, subprocess.Popen[bytes]]

    @property
    def url(self) -> str:
        return ";".join(f"sentinel://127.0.0.1:{port}/0" for port in self.sentinel_ports)

    def client(self, port: int) -> redis.Redis[bytes]:
        return redis.Redis(port=port, socket_timeout=2, socket_connect_timeout=2)

    def kill_primary(self) -> float:
        """SIGKILL the primary once the replica has every write so far; when it died."""
        assert self.client(self.primary_port).wait(1, 5000) == 1, "the replica lags"
        self.processes["primary"].send_signal(signal.SIGKILL)
        self.processes["primary"].wait(10)
        return time.monotonic()

    def role(self, port: int) -> str:
        return str(self.client(port).info("replication")["role"])


@pytest.fixture
def redis_group(tmp_path: Path) -> Iterator[RedisGroup]:
    primary, replica = free_port(), free_port()
    common = ["--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(tmp_path)]
    processes = {
        "primary": _redis_server("--port", str(primary), *common, log=tmp_path / "primary.log"),
        "replica": _redis_server(
            "--port", str(replica), "--replicaof", "127.0.0.1", str(primary), *common,
            log=tmp_path / "replica.log",
        ),
    }  # fmt: skip
    sentinels = [free_port() for _ in range(3)]
    for index, port in enumerate(sentinels):
        conf = tmp_path / f"sentinel-{index}.conf"  # Sentinel rewrites its file: one each
        conf.write_text(
            f"port {port}\nbind 127.0.0.1\ndir {tmp_path}\n"
            f"sentinel monitor {MASTER} 127.0.0.1 {primary} 2\n"
            f"sentinel down-after-milliseconds {MASTER} 1000\n"
            f"sentinel failover-timeout {MASTER} 5000\n"
            f"sentinel parallel-syncs {MASTER} 1\n"
        )
        processes[f"sentinel-{index}"] = _redis_server(
            str(conf), "--sentinel", log=tmp_path / f"sentinel-{index}.log"
        )
    group = RedisGroup(primary, replica, sentinels, processes)
    try:

        def ready() -> bool:
            try:
                if group.role(replica) != "slave":
                    return False
                # Every Sentinel knows the replica and the other Sentinels: a quorum
                # can agree and one of them can be elected to fail over.
                for port in sentinels:
                    seen = group.client(port).info("sentinel")["master0"]
                    if (seen["slaves"], seen["sentinels"]) != (1, 3):
                        return False
                link = group.client(replica).info("replication")["master_link_status"]
                return bool(link == "up")
            except REDIS_ERRORS:
                return False

        wait_until(ready, timeout=30, what="the replica and three Sentinels")
        yield group
    finally:
        for process in processes.values():
            if process.poll() is None:
                process.kill()
                process.wait(10)


def _until_written(client: redis.Redis[bytes], key: str, value: str) -> bool:
    try:
        return bool(client.set(key, value))
    except REDIS_ERRORS:
        return False


def _promoted(group: RedisGroup) -> bool:
    try:
        return group.role(group.replica_port) == "master" and all(
            group.client(port).info("sentinel")["master0"]["address"]
            == f"127.0.0.1:{group.replica_port}"
            for port in group.sentinel_ports
        )
    except REDIS_ERRORS:
        return False


def test_the_projects_redis_client_follows_a_sentinel_failover(redis_group: RedisGroup) -> None:
    client = redis_client(
        redis_group.url, master=MASTER, socket_timeout=1, socket_connect_timeout=1
    )
    assert client.set("before", "1")
    assert redis_group.role(redis_group.primary_port) == "master"

    died = redis_group.kill_primary()
    wait_until(lambda: _until_written(client, "after", "2"), timeout=30, what="a write")
    recovered_s = time.monotonic() - died

    # The same client object, now at the promoted replica, with what was written before.
    assert redis_group.role(redis_group.replica_port) == "master"
    assert client.get("before") == b"1"
    assert client.get("after") == b"2"
    # Sentinel's down-after is 1 s; the election and promotion take a few more.
    assert recovered_s < 30


def test_the_broker_follows_a_sentinel_failover(redis_group: RedisGroup) -> None:
    options = celery_sentinel_options(MASTER, 2)
    with Connection(redis_group.url, transport_options=options) as conn:
        queue = conn.SimpleQueue("failover-test")
        queue.put({"n": 1})
        redis_group.kill_primary()

        queue.close()

        def published() -> bool:
            # As Celery's producer does after a connection error: the connection is
            # re-established (kombu asks the Sentinels for the primary again).
            try:
                conn.ensure_connection(max_retries=1)
                with conn.SimpleQueue("failover-test") as again:
                    again.put({"n": 2})
                return True
            except Exception:  # noqa: BLE001 - the broker is between primaries
                conn.close()
                return False

        wait_until(published, timeout=30, what="a publish after the failover")
        with conn.SimpleQueue("failover-test") as again:
            got = sorted(again.get(timeout=10).payload["n"] for _ in range(2))
    assert got == [1, 2]  # the message sent before the failover was kept (WAIT)


@pytest.mark.django_db(transaction=True)
def test_a_worker_and_a_client_through_sentinel_run_work_across_a_failover(
    redis_group: RedisGroup, tmp_path: Path
) -> None:
    """A real worker and a process submitting a run, both configured by URLs alone
    (``CELERY_BROKER_URL`` names the Sentinels): a run completes before the primary is
    lost and another after it, on the promoted replica. Transactional: the demo runs the
    other processes commit are flushed after, not left to the tests that count runs."""
    env = child_env(CELERY_BROKER_URL=redis_group.url, REDIS_SENTINEL_MASTER=MASTER)
    worker = Child(
        python_cmd(
            "-m", "celery", "-A", "config", "worker", "--concurrency", "2",
            "--pool", "prefork", "--hostname", f"sentinel-{free_port()}@localhost",
            "--without-mingle", "--without-gossip", "--loglevel", "INFO",
        ),
        env,
        tmp_path / "worker.log",
    )  # fmt: skip
    try:
        for attempt in ("before", "after"):
            if attempt == "after":
                redis_group.kill_primary()
                # A publish while no primary is elected fails after Celery's retries
                # (the lost-message sweep of beat, not running here, resends it): the
                # client starts once the Sentinels have promoted the replica.
                wait_until(lambda: _promoted(redis_group), timeout=30, what="the replica promoted")
            demo = subprocess.run(
                python_cmd("manage.py", "demo_run", "--timeout", "90"),
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert demo.returncode == 0, (attempt, demo.stdout, demo.stderr, worker.output())
            assert "completed" in demo.stdout
        assert redis_group.role(redis_group.replica_port) == "master"
    finally:
        worker.stop(timeout=10)
        worker.kill_group()


# --------------------------------------------------------------------------- PostgreSQL
def _connect(url: str) -> psycopg.Connection:
    """Connect as Django would with ``DATABASE_URL=url`` (its settings' parsing)."""
    wrapper = DatabaseWrapper({**database_config(url), "TIME_ZONE": None}, "failover")
    params = wrapper.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    params.pop("prepare_threshold", None)
    params.pop("server_side_binding", None)
    params.pop("pool", None)
    return psycopg.connect(**params)


@pytest.mark.django_db
def test_several_postgresql_hosts_are_tried_in_order_for_one_that_takes_writes() -> None:
    db = settings.DATABASES["default"]
    dead = free_port()  # nothing listens there: the host that is gone
    url = (
        f"postgres://{db['USER']}@127.0.0.1:{dead},{db['HOST']}:{db['PORT']}/{db['NAME']}"
        "?target_session_attrs=read-write"
    )

    config = database_config(url)
    assert (config["HOST"], config["PORT"]) == (f"127.0.0.1,{db['HOST']}", f"{dead},{db['PORT']}")
    assert config["OPTIONS"]["target_session_attrs"] == "read-write"
    assert config["OPTIONS"]["tcp_user_timeout"] > 0
    assert config["OPTIONS"]["keepalives"] == 1
    with _connect(url) as conn:
        row = conn.execute("SELECT inet_server_port(), pg_is_in_recovery()").fetchone()
        # The server side is told to drop a session left idle inside a transaction (a
        # client cut off holding locks) and to probe a silent client.
        server_side = conn.execute(
            "SELECT current_setting('idle_in_transaction_session_timeout'),"
            " current_setting('tcp_keepalives_idle')"
        ).fetchone()
    assert row == (int(db["PORT"]), False)
    assert server_side == ("30s", "10")


@pytest.mark.django_db(transaction=True)
def test_a_session_left_idle_inside_a_transaction_is_dropped_and_its_locks_go(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A client cut off by the network while it holds locks in an open transaction (a
    worker host partitioned mid-recording) looks to the server like a session idling in
    it: the server drops it after DATABASE_IDLE_IN_TRANSACTION_TIMEOUT_S, so the sweeps
    and recordings waiting on its locks go on (make chaos-net's finding: without it, they
    waited for the partition to heal)."""
    monkeypatch.setenv("DATABASE_IDLE_IN_TRANSACTION_TIMEOUT_S", "1")
    db = settings.DATABASES["default"]
    url = f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"
    holder = _connect(url)
    other = _connect(url)
    try:
        holder.execute("SELECT pg_advisory_xact_lock(4242)")  # psycopg: a transaction opened

        def taken_by_other() -> bool:
            with other.transaction():
                row = other.execute("SELECT pg_try_advisory_xact_lock(4242)").fetchone()
            return bool(row and row[0])

        assert not taken_by_other()
        wait_until(taken_by_other, timeout=20)  # the server dropped the idle holder
        with pytest.raises(psycopg.errors.IdleInTransactionSessionTimeout):
            holder.execute("SELECT 1")
    finally:
        holder.close()
        other.close()
