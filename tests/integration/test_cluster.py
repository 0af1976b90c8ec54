"""`make cluster`: the stack as fourteen hosts in network namespaces (reliability.cluster),
started, proved by a run through each web host (one with a job on the runner host),
then removed without a trace; and its preflight refusing what would break its isolation.
Root only (namespaces, a bridge); every address is in 198.18.0.0/24, on a bridge attached
to no physical interface, so no test traffic leaves the machine."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import pytest
import redis

from reliability import cluster
from reliability.stack import wait_for
from tests.support import ROOT, python_cmd


def _namespaces_work() -> bool:
    """Root, iproute2, and a network namespace can be made here (not in every container)."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        return False
    # Each test process probes with a name of its own: they collect at the same time.
    probe = f"orch-probe-{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True)
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return made.returncode == 0


pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not _namespaces_work(), reason="needs root and network namespaces"),
]


def _cluster(*args: str, directory: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        python_cmd("scripts/cluster.py", *args, "--dir", str(directory)),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=400,
    )


def _leftovers() -> list[str]:
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    found = [line.split()[0] for line in namespaces.splitlines() if line.startswith("orch-")]
    bridge = subprocess.run(["ip", "link", "show", cluster.BRIDGE], capture_output=True)
    return found + ([cluster.BRIDGE] if bridge.returncode == 0 else [])


def test_the_cluster_comes_up_runs_work_through_each_web_host_and_goes() -> None:
    # Not under pytest's tmp_path: PostgreSQL's account must reach its data directory,
    # and pytest's base directory is its owner's alone.
    directory = Path(tempfile.gettempdir()) / f"orchestrator-cluster-test-{uuid.uuid4().hex[:8]}"
    try:
        result = _cluster("up", "--check", directory=directory)
    finally:
        _cluster("down", directory=directory)  # whatever happened, nothing stays

    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "target_session_attrs=read-write" in out
    assert "db1 198.18.0.11" in out
    assert "sentinel://198.18.0.31:26379/0;sentinel://198.18.0.32:26379/0" in out
    assert "through web1: completed" in out
    assert "through web2: completed" in out
    assert "output of the runner host's job: {'ran': True}" in out
    assert "cluster removed" in out
    assert _leftovers() == []
    assert not directory.exists()


def test_the_preflight_refuses_an_address_of_the_range_already_in_use(tmp_path: Path) -> None:
    # A bridge left down, with no ports (no traffic), holding an address of
    # 198.18.0.0/15: the cluster would not be alone in its range, so it must not start,
    # and must leave that link alone.
    subprocess.run(["ip", "link", "add", "orchtest0", "type", "bridge"], check=True)
    try:
        subprocess.run(["ip", "addr", "add", "198.19.7.7/32", "dev", "orchtest0"], check=True)
        result = _cluster("up", directory=tmp_path / "cluster")
        still = subprocess.run(["ip", "-4", "addr", "show", "orchtest0"], capture_output=True)
    finally:
        subprocess.run(["ip", "link", "del", "orchtest0"], check=False)

    assert result.returncode == 1
    assert "198.18.0.0/15 is already in use on this machine" in result.stderr
    assert b"198.19.7.7" in still.stdout
    assert _leftovers() == []


def test_the_preflight_refuses_while_an_earlier_cluster_is_there(tmp_path: Path) -> None:
    subprocess.run(["ip", "netns", "add", "orch-leftover"], check=True)
    try:
        result = _cluster("up", directory=tmp_path / "cluster")
        kept = "orch-leftover" in _leftovers()
    finally:
        subprocess.run(["ip", "netns", "del", "orch-leftover"], check=False)

    assert result.returncode == 1
    assert "make cluster-down first" in result.stderr
    assert kept  # refused, and nothing of the earlier cluster was touched


def _redis2_promoted() -> bool:
    try:
        sentinel = redis.Redis(host=cluster.address("sentinel1"), port=cluster.SENTINEL_PORT)
        master = sentinel.info("sentinel")["master0"]["address"]
        return bool(master == f"{cluster.address('redis2')}:{cluster.REDIS_PORT}")
    except redis.RedisError:
        return False


def test_the_cluster_goes_on_after_each_stores_primary_is_lost() -> None:
    """db1's host lost (link down, PostgreSQL killed) and db2 promoted: every process
    reaches db2 through the same DATABASE_URL and runs through both web hosts complete;
    db1 is rebuilt as db2's synchronous replica. Then redis1's host lost: the Sentinels
    promote redis2, everyone follows, and runs complete again."""
    directory = Path(tempfile.gettempdir()) / f"orchestrator-cluster-test-{uuid.uuid4().hex[:8]}"
    try:
        cluster.up(directory)
        hosts = cluster.Cluster(directory)
        org = json.loads((directory / "organization.json").read_text())

        lost = time.monotonic()
        hosts.lose_db_primary()
        after_db = cluster.smoke(org, timeout=120)
        db_recovered_s = time.monotonic() - lost
        hosts.restore_link("db1")
        hosts.make_replica("db1", "db2")  # waits until db1 streams synchronously

        lost = time.monotonic()
        hosts.lose_host("redis1")
        # A publish made while no primary is elected fails after Celery's retries and
        # waits for the lost-message sweep (ENGINE_LOST_MESSAGE_AFTER, 120 s): the runs
        # are submitted once the Sentinels have promoted redis2.
        wait_for(_redis2_promoted, 60, "the Sentinels promoting redis2")
        after_redis = cluster.smoke(org, timeout=120)
        redis_recovered_s = time.monotonic() - lost
    finally:
        cluster.down(directory)

    for lines in (after_db, after_redis):
        assert [line.split(": ")[1].split(" in ")[0] for line in lines] == ["completed"] * 2
    print(
        f"runs through both web hosts completed {db_recovered_s:.1f} s after db1 was lost "
        f"and {redis_recovered_s:.1f} s after redis1 was lost"
    )
    assert _leftovers() == []


def test_a_partition_cuts_two_hosts_off_both_ways_and_heals() -> None:
    """The network alone (no processes): ``partition`` puts a blackhole route to each
    side in the other's namespace, ``heal`` takes both away, and nothing else moves."""
    cluster.preflight()
    try:
        cluster.make_network()

        def routes(host: str) -> str:
            found = subprocess.run(
                ["ip", "-n", cluster.namespace(host), "route", "show"],
                capture_output=True,
                text=True,
                check=True,
            )
            return found.stdout

        cluster.partition("worker1", "db1", "db2")
        assert "blackhole 198.18.0.11" in routes("worker1")
        assert "blackhole 198.18.0.12" in routes("worker1")
        assert "blackhole 198.18.0.51" in routes("db1")
        assert "blackhole" not in routes("worker2")  # only the partitioned hosts
        cluster.check_network()  # still no default route anywhere

        cluster.heal("worker1", "db1", "db2")
        assert "blackhole" not in routes("worker1") + routes("db1") + routes("db2")
    finally:
        cluster.remove_network()
    assert _leftovers() == []
