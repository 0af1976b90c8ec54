#!/usr/bin/env python3
"""Start and stop the project-local PostgreSQL and Redis servers (stdlib only).

`make run` keeps their data in `.data/` on fixed ports; `make test` makes throwaway ones
in a temporary folder on free loopback ports, so a developer's running stack never
collides with a test run. `start` prints shell `export` lines for the URLs.

PostgreSQL refuses to run as root, so as root the server runs as the `postgres` user.
"""

from __future__ import annotations

import argparse
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

PG_USER = "orchestrator"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def pg_bin(name: str) -> str:
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)
    if candidates:
        return candidates[0]
    sys.exit(f"{name} not found: install PostgreSQL server binaries (apt-get install postgresql)")


def server_user() -> str | None:
    """The unprivileged account to run PostgreSQL as, or None when we are not root."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "orchestrator-pg"):
        try:
            pwd.getpwnam(name)
            return name
        except KeyError:
            continue
    subprocess.run(
        [
            "useradd",
            "--system",
            "--no-create-home",
            "--shell",
            "/usr/sbin/nologin",
            "orchestrator-pg",
        ],
        check=True,
    )
    return "orchestrator-pg"


def as_server_user(cmd: list[str]) -> list[str]:
    user = server_user()
    return ["runuser", "-u", user, "--", *cmd] if user else cmd


def chown_for_server(path: Path) -> None:
    user = server_user()
    if user:
        entry = pwd.getpwnam(user)
        os.chown(path, entry.pw_uid, entry.pw_gid)


def wait_for(predicate, what: str, timeout: float = 60.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    sys.exit(f"timed out waiting for {what}")


def start_postgres(root: Path, port: int, dbname: str, fast: bool) -> str:
    if not dbname.replace("_", "").isalnum():
        sys.exit(f"database name must be letters, digits and underscores: {dbname!r}")
    data = root / "postgres"
    log = root / "postgres.log"
    root.mkdir(parents=True, exist_ok=True)
    os.chmod(root, 0o755)  # noqa: S103 - the server account must reach its data dir
    if not (data / "PG_VERSION").exists():
        data.mkdir(parents=True, exist_ok=True)
        chown_for_server(data)
        os.chmod(data, 0o700)
        subprocess.run(
            as_server_user(
                [
                    pg_bin("initdb"),
                    "-D",
                    str(data),
                    "-U",
                    PG_USER,
                    "--auth=trust",
                    "--encoding=UTF8",
                    "--no-instructions",
                ]
            ),
            check=True,
            stdout=subprocess.DEVNULL,
        )
    if not log.exists():
        log.touch()
    chown_for_server(log)
    options = [
        f"-p {port}",
        "-c listen_addresses=127.0.0.1",
        f"-k {data}",
        "-c max_connections=200",
    ]
    if fast:
        # Throwaway test server: durability buys nothing, speed does.
        options += ["-c fsync=off", "-c synchronous_commit=off", "-c full_page_writes=off"]
    status = subprocess.run(
        as_server_user([pg_bin("pg_ctl"), "-D", str(data), "status"]), capture_output=True
    )
    if status.returncode != 0:
        subprocess.run(
            as_server_user(
                [
                    pg_bin("pg_ctl"),
                    "-D",
                    str(data),
                    "-l",
                    str(log),
                    "-w",
                    "-t",
                    "60",
                    "-o",
                    " ".join(options),
                    "start",
                ]
            ),
            check=True,
            stdout=subprocess.DEVNULL,
        )
    wait_for(lambda: port_open(port), f"PostgreSQL on port {port}")
    exists = subprocess.run(
        [
            pg_bin("psql"),
            "-h",
            "127.0.0.1",
            "-p",
            str(port),
            "-U",
            PG_USER,
            "-d",
            "postgres",
            "-tAc",
            f"SELECT 1 FROM pg_database WHERE datname = '{dbname}'",  # noqa: S608 - checked above
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    if exists != "1":
        subprocess.run(
            [
                pg_bin("psql"),
                "-h",
                "127.0.0.1",
                "-p",
                str(port),
                "-U",
                PG_USER,
                "-d",
                "postgres",
                "-qc",
                f'CREATE DATABASE "{dbname}"',
            ],
            check=True,
        )
    return f"postgres://{PG_USER}@127.0.0.1:{port}/{dbname}"


def stop_postgres(root: Path) -> None:
    data = root / "postgres"
    if (data / "postmaster.pid").exists():
        subprocess.run(
            as_server_user([pg_bin("pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"]),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )


def start_redis(root: Path, port: int, aof: bool = False) -> str:
    """Start Redis unless something answers on ``port``.

    ``aof``: append-only file with fsync every second, the persistence `make run` and
    production use (docs/reliability.md): a restart keeps queued messages, a crash loses
    at most the last second. Throwaway test servers keep nothing.
    """
    data = root / "redis"
    data.mkdir(parents=True, exist_ok=True)
    pidfile = data / "redis.pid"
    if not port_open(port):
        server = shutil.which("redis-server")
        if not server:
            sys.exit("redis-server not found: apt-get install redis-server")
        subprocess.run(
            [
                server,
                "--port",
                str(port),
                "--bind",
                "127.0.0.1",
                "--daemonize",
                "yes",
                "--dir",
                str(data),
                "--pidfile",
                str(pidfile),
                "--logfile",
                str(data / "redis.log"),
                "--save",
                "",
                "--appendonly",
                "yes" if aof else "no",
                "--appendfsync",
                "everysec",
                "--protected-mode",
                "yes",
            ],
            check=True,
        )
    wait_for(lambda: port_open(port), f"Redis on port {port}")
    return f"redis://127.0.0.1:{port}/0"


def stop_redis(root: Path) -> None:
    pidfile = root / "redis" / "redis.pid"
    try:
        pid = int(pidfile.read_text().strip())
    except (FileNotFoundError, ValueError):
        return
    try:
        # A stale pid file may name a recycled pid: only signal a Redis server.
        if b"redis-server" not in Path(f"/proc/{pid}/cmdline").read_bytes():
            return
        os.kill(pid, signal.SIGTERM)
    except (ProcessLookupError, FileNotFoundError):
        return
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)


def start_pgbouncer(root: Path, port: int, pg_port: int, pool: int) -> None:
    """PgBouncer in transaction mode in front of PostgreSQL, ``pool`` server connections
    per database: how a fleet of workers on many hosts shares PostgreSQL. Runs as the
    server account (PgBouncer refuses root too)."""
    server = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
    if not Path(server).exists():
        sys.exit("pgbouncer not found: apt-get install pgbouncer")
    data = root / "pgbouncer"
    data.mkdir(parents=True, exist_ok=True)
    (data / "userlist.txt").write_text(f'"{PG_USER}" ""\n')
    (data / "pgbouncer.ini").write_text(
        "[databases]\n"
        f"* = host=127.0.0.1 port={pg_port}\n"
        "[pgbouncer]\n"
        "listen_addr = 127.0.0.1\n"
        f"listen_port = {port}\n"
        "unix_socket_dir =\n"
        "auth_type = trust\n"
        f"auth_file = {data / 'userlist.txt'}\n"
        "pool_mode = transaction\n"
        f"default_pool_size = {pool}\n"
        "max_client_conn = 2000\n"
        f"logfile = {data / 'pgbouncer.log'}\n"
        f"pidfile = {data / 'pgbouncer.pid'}\n"
    )
    for path in (data, *data.iterdir()):
        chown_for_server(path)
    subprocess.run(as_server_user([server, "-d", str(data / "pgbouncer.ini")]), check=True)
    wait_for(lambda: port_open(port), f"PgBouncer on port {port}")


def stop_pgbouncer(root: Path) -> None:
    pidfile = root / "pgbouncer" / "pgbouncer.pid"
    try:
        pid = int(pidfile.read_text().strip())
        if b"pgbouncer" in Path(f"/proc/{pid}/cmdline").read_bytes():
            os.kill(pid, signal.SIGTERM)
    except (FileNotFoundError, ValueError, ProcessLookupError):
        return


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    start = sub.add_parser("start", help="start servers and print export lines")
    start.add_argument("--dir", required=True, type=Path)
    start.add_argument("--pg-port", type=int, default=0, help="0 picks a free port")
    start.add_argument("--redis-port", type=int, default=0, help="0 picks a free port")
    start.add_argument("--db", default="orchestrator")
    start.add_argument("--fast", action="store_true", help="no fsync: throwaway test server")
    start.add_argument(
        "--redis-aof", action="store_true", help="Redis append-only file, fsync every second"
    )
    start.add_argument(
        "--pgbouncer",
        type=int,
        default=0,
        metavar="POOL",
        help="put PgBouncer (transaction mode, POOL server connections) in front of "
        "PostgreSQL; DATABASE_URL then names PgBouncer, DATABASE_DIRECT_URL the server",
    )
    start.add_argument("--no-postgres", action="store_true")
    start.add_argument("--no-redis", action="store_true")
    stop = sub.add_parser("stop", help="stop the servers started in --dir")
    stop.add_argument("--dir", required=True, type=Path)
    args = parser.parse_args()

    root = args.dir.resolve()
    if args.command == "stop":
        stop_pgbouncer(root)
        stop_postgres(root)
        stop_redis(root)
        return
    if not args.no_postgres:
        pg_port = args.pg_port or free_port()
        url = start_postgres(root, pg_port, args.db, args.fast)
        if args.pgbouncer:
            bouncer = free_port()
            start_pgbouncer(root, bouncer, pg_port, args.pgbouncer)
            print(f"export DATABASE_DIRECT_URL={url}")
            url = url.replace(f":{pg_port}/", f":{bouncer}/")
        print(f"export DATABASE_URL={url}")
    if not args.no_redis:
        url = start_redis(root, args.redis_port or free_port(), aof=args.redis_aof)
        print(f"export CELERY_BROKER_URL={url}")


if __name__ == "__main__":
    main()
