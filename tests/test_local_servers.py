"""`scripts/local_servers.py`, the PostgreSQL and Redis of `make run` and `make test`.

A checkout under a folder the server account cannot enter (a root user's 0700 home, a
`mktemp -d` folder) keeps PostgreSQL's data in a folder of its own that the account can
reach, says where in one line, and finds the same data on its next start. A server that
does not start stops everything at once with one line (what failed, the log to read)
and exit status 1: no traceback, and `make run` goes no further."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import redis

from tests.support import ROOT, free_port

LOCAL_SERVERS = str(ROOT / "scripts" / "local_servers.py")


def local_servers(
    *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, LOCAL_SERVERS, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def exported(stdout: str) -> dict[str, str]:
    return dict(re.findall(r"^export (\w+)=(.*)$", stdout, re.MULTILINE))


@pytest.fixture
def private_checkout(tmp_path: Path) -> Iterator[Path]:
    """A checkout's data folder under a parent only its owner, root, may enter."""
    parent = tmp_path / "private"
    parent.mkdir(mode=0o700)
    os.chmod(parent, 0o700)
    data = parent / "checkout" / ".data"
    yield data
    local_servers("stop", "--dir", str(data))


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A data folder the server account can enter, as `make test`'s are (pytest's own
    temporary folders are 0700: PostgreSQL's data would move, and say so)."""
    path = Path(tempfile.mkdtemp(prefix="orchestrator-local-servers-test-"))
    path.chmod(0o755)
    yield path
    local_servers("stop", "--dir", str(path))
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="PostgreSQL runs as another account only as root")
def test_a_checkout_the_server_account_cannot_enter_keeps_its_data_where_it_can(
    private_checkout: Path,
) -> None:
    pg_port, redis_port = free_port(), free_port()
    start = ["start", "--dir", str(private_checkout), "--pg-port", str(pg_port)]
    start += ["--redis-port", str(redis_port), "--redis-aof"]
    home = None
    try:
        first = local_servers(*start)
        assert first.returncode == 0, first.stderr
        said = first.stderr.strip().splitlines()
        assert len(said) == 1, first.stderr
        found = re.fullmatch(
            r"PostgreSQL's data lives in (\S+) \(the \S+ account cannot enter .*\)", said[0]
        )
        assert found, said
        home = Path(found[1])
        assert str(private_checkout) not in str(home)
        urls = exported(first.stdout)
        with psycopg.connect(urls["DATABASE_URL"], autocommit=True) as connection:
            connection.execute("CREATE TABLE kept (word text)")
            connection.execute("INSERT INTO kept VALUES ('still here')")
        redis.Redis.from_url(urls["CELERY_BROKER_URL"]).set("kept", "still here")

        stopped = local_servers("stop", "--dir", str(private_checkout))
        again = local_servers(*start)

        assert stopped.returncode == 0, stopped.stderr
        assert again.returncode == 0, again.stderr
        assert again.stderr.strip() == said[0]
        assert exported(again.stdout) == urls
        with psycopg.connect(urls["DATABASE_URL"]) as connection:
            assert connection.execute("SELECT word FROM kept").fetchall() == [("still here",)]
        assert redis.Redis.from_url(urls["CELERY_BROKER_URL"]).get("kept") == b"still here"

        # `make clean`: the servers stop, and their data goes, wherever it lives.
        removed = local_servers("remove", "--dir", str(private_checkout))
        assert removed.returncode == 0, removed.stderr
        assert not home.exists()
        assert not private_checkout.exists()
    finally:
        local_servers("stop", "--dir", str(private_checkout))
        if home is not None:
            shutil.rmtree(home, ignore_errors=True)


def assert_one_line_and_status_1(result: subprocess.CompletedProcess[str], *parts: str) -> str:
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    assert "export" not in result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    for part in parts:
        assert part in lines[0], lines[0]
    return lines[0]


def test_a_postgresql_port_taken_by_another_program_stops_the_start(open_dir: Path) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]

        result = local_servers(
            "start", "--dir", str(open_dir), "--pg-port", str(port), "--no-redis"
        )

    assert_one_line_and_status_1(result, "PostgreSQL", f"127.0.0.1:{port} is taken")


def test_a_redis_that_exits_at_once_stops_the_start_naming_its_log(
    open_dir: Path, tmp_path: Path
) -> None:
    fake = tmp_path / "bin" / "redis-server"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho '*** FATAL CONFIG FILE ERROR: unknown option' >&2\nexit 1\n")
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{fake.parent}{os.pathsep}{os.environ['PATH']}"}
    port = free_port()

    result = local_servers(
        "start", "--dir", str(open_dir), "--redis-port", str(port), "--no-postgres", env=env
    )

    line = assert_one_line_and_status_1(
        result, f"Redis did not start on 127.0.0.1:{port}", "FATAL CONFIG FILE ERROR"
    )
    assert line.endswith(f"(log: {open_dir / 'redis' / 'redis.log'})")


def test_a_postgresql_that_will_not_start_stops_the_start_naming_its_log(open_dir: Path) -> None:
    port = free_port()
    start = ["start", "--dir", str(open_dir), "--pg-port", str(port), "--no-redis", "--fast"]
    started = local_servers(*start)
    assert started.returncode == 0, started.stderr
    local_servers("stop", "--dir", str(open_dir))
    (open_dir / "postgres" / "postgresql.auto.conf").write_text("shared_buffers = 'lots'\n")

    result = local_servers(*start)

    line = assert_one_line_and_status_1(
        result, f"PostgreSQL did not start on 127.0.0.1:{port}", "FATAL"
    )
    assert line.endswith(f"(log: {open_dir / 'postgres.log'})")


def test_make_run_goes_no_further_than_a_server_that_did_not_start(open_dir: Path) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        env = {
            key: value
            for key, value in os.environ.items()
            if key not in ("DATABASE_URL", "CELERY_BROKER_URL")
        }
        env.update(
            DATA_DIR=str(open_dir),
            DEV_PG_PORT=str(port),
            DEV_REDIS_PORT=str(free_port()),
            PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        )

        run = subprocess.run(
            ["bash", str(ROOT / "scripts" / "run.sh")],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
            start_new_session=True,
        )

    assert run.returncode == 1, run.stdout + run.stderr
    assert run.stderr.strip().splitlines() == [
        f"PostgreSQL cannot start: 127.0.0.1:{port} is taken by another program "
        "(another make run? DEV_PG_PORT chooses another port)"
    ]
    assert "==> migrating" not in run.stdout
    assert "Traceback" not in run.stdout + run.stderr
