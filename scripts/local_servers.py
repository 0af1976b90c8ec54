#!/usr/bin/env python3
"""Start and stop the project-local PostgreSQL and Redis servers (stdlib only).

`make run` keeps their data in `.data/` on fixed ports; `make test` makes throwaway ones
in a temporary folder on free loopback ports, so a developer's running stack never
collides with a test run. `start` prints shell `export` lines for the URLs.

PostgreSQL refuses to run as root, so as root the server runs as the `postgres` user.
That account must be able to enter the data folder: a checkout under a folder only root
may enter (`/root/app`, a `mktemp -d` folder) keeps PostgreSQL's data in a folder of its
own under /var/tmp instead, named after the checkout and kept between runs (`pg_home`).

A server that does not start ends `start` with one line on stderr (what failed, the log
to read) and exit status 1, never a traceback. `wait-healthy` waits for the web process's
/healthz without paying Django's start-up beside the processes starting.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import hashlib
import json
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

PG_USER = "orchestrator"


class ServerFailed(RuntimeError):
    """A server did not start; the message is the one line to show (what, and its log)."""


def failed(what: str, log: Path, since: int = 0, fallback: str = "") -> ServerFailed:
    """``what`` failed: the log's telling line (written after offset ``since``) and where
    to read the rest."""
    reason = telling_line(log, since) or fallback
    return ServerFailed(f"{what}{': ' + reason if reason else ''} (log: {log})")


def telling_line(log: Path, since: int = 0) -> str:
    """The line of a server's log that says why it stopped: the first that names a cause
    (`could not bind ...`) or else the last error, fatal or not."""
    try:
        with log.open("rb") as handle:
            handle.seek(since)
            lines = handle.read().decode(errors="replace").splitlines()
    except OSError:
        return ""
    # Without the time and pid each line starts with: PostgreSQL's `2026-11-27
    # 21:37:55.091 UTC [32156] `, Redis's `32156:M 27 Nov 2026 21:37:55.091 # `.
    lines = [
        re.sub(r"^\d{4}-\d\d-\d\d [\d:.]+ \w+ \[\d+\] |^\d+:\w [^#*]+[#*] ", "", line).strip()
        for line in lines
    ]
    for line in lines:
        if "could not" in line or "Address already in use" in line:
            return line
    errors = [line for line in lines if re.search(r"FATAL|PANIC|ERROR|error|Warning", line)]
    return (errors or [line for line in lines if line] or [""])[-1]


def log_size(log: Path) -> int:
    try:
        return log.stat().st_size
    except OSError:
        return 0


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
    raise ServerFailed(
        f"{name} not found: install PostgreSQL server binaries (apt-get install postgresql)"
    )


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
    raise ServerFailed(f"timed out waiting for {what}")


def server_can_enter(path: Path) -> bool:
    """Whether the server account can reach ``path``: search permission on it and on
    every folder above it (a 0700 parent owned by root stops it)."""
    user = server_user()
    if user is None:
        return True
    test = ["runuser", "-u", user, "--", "test", "-x", str(path)]
    return subprocess.run(test, capture_output=True).returncode == 0


def pg_home(root: Path) -> Path:
    """The folder for PostgreSQL's data and log: ``root`` when the server account can
    enter it, else a folder under /var/tmp (the temporary directory if there is none)
    named after ``root``, the same on every run, so that a second start finds the data of
    the first. The same answer for `start` and `stop`."""
    if server_can_enter(root):
        return root
    base = Path("/var/tmp")  # noqa: S108 - kept across reboots; claim_home checks it is ours
    if not (base.is_dir() and os.access(base, os.W_OK | os.X_OK)):
        base = Path(tempfile.gettempdir())
    slug = re.sub(r"[^A-Za-z0-9._]+", "-", str(root)).strip("-")[-40:].lstrip("-")
    digest = hashlib.sha256(str(root).encode()).hexdigest()[:8]
    return base / f"orchestrator-pg-{slug}-{digest}"


def claim_home(home: Path) -> None:
    """Create ``home`` (readable by the server account), or check that the one there is a
    folder of ours: under a world-writable /var/tmp, another user could have put a link
    or a folder of theirs in its place."""
    home.mkdir(parents=True, exist_ok=True)
    found = home.lstat()
    if not home.is_dir() or home.is_symlink() or found.st_uid != os.geteuid():
        raise ServerFailed(f"{home} is not a folder of this user's: remove it and start again")
    os.chmod(home, 0o755)  # noqa: S103 - the server account must reach its data dir


def start_postgres(
    root: Path, port: int, dbname: str, fast: bool, settings: tuple[str, ...] = ()
) -> str:
    """Start PostgreSQL unless it runs; ``settings`` (``name=value``) are given to the
    server as ``-c`` options after our own, so they win (``make capacity`` loads
    pg_stat_statements and turns durability back on for a ``fast`` server)."""
    if not dbname.replace("_", "").isalnum():
        raise ServerFailed(f"database name must be letters, digits and underscores: {dbname!r}")
    root.mkdir(parents=True, exist_ok=True)
    os.chmod(root, 0o755)  # noqa: S103 - the server account must reach its data dir
    home = pg_home(root)
    if home != root:
        claim_home(home)
        print(
            f"PostgreSQL's data lives in {home} (the {server_user()} account cannot enter {root})",
            file=sys.stderr,
        )
    data = home / "postgres"
    log = home / "postgres.log"
    if not log.exists():
        log.touch()
    chown_for_server(log)
    if not (data / "PG_VERSION").exists():
        data.mkdir(parents=True, exist_ok=True)
        chown_for_server(data)
        os.chmod(data, 0o700)
        since = log_size(log)
        with log.open("ab") as output:
            initdb = subprocess.run(
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
                stdout=output,
                stderr=output,
            )
        if initdb.returncode != 0:
            raise failed(f"PostgreSQL's initdb failed for {data}", log, since)
    options = [
        f"-p {port}",
        "-c listen_addresses=127.0.0.1",
        # TCP only: a Unix socket's path is limited to 107 bytes, which a checkout deep
        # enough would pass (every client here connects to 127.0.0.1).
        "-k ''",
        "-c max_connections=200",
    ]
    if fast:
        # Throwaway test server: durability buys nothing, speed does.
        options += ["-c fsync=off", "-c synchronous_commit=off", "-c full_page_writes=off"]
    for setting in settings:
        # pg_ctl hands -o to the server split at spaces: a value may hold none.
        name, equals, value = setting.partition("=")
        if not (equals and re.fullmatch(r"[a-z_.]+", name) and re.fullmatch(r"[\w.,-]+", value)):
            raise ServerFailed(f"a PostgreSQL setting is name=value, no spaces: {setting!r}")
        options.append(f"-c {name}={value}")
    status = subprocess.run(
        as_server_user([pg_bin("pg_ctl"), "-D", str(data), "status"]), capture_output=True
    )
    if status.returncode != 0:
        if port_open(port):
            raise ServerFailed(
                f"PostgreSQL cannot start: 127.0.0.1:{port} is taken by another program "
                "(another make run? DEV_PG_PORT chooses another port)"
            )
        since = log_size(log)
        started = subprocess.run(
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
            capture_output=True,
            text=True,
        )
        if started.returncode != 0:
            said = (started.stderr or started.stdout).strip().splitlines()
            raise failed(
                f"PostgreSQL did not start on 127.0.0.1:{port}",
                log,
                since,
                fallback=said[0] if said else "",
            )
    wait_for(lambda: port_open(port), f"PostgreSQL on port {port} (log: {log})")
    psql = [pg_bin("psql"), "-h", "127.0.0.1", "-p", str(port), "-U", PG_USER, "-d", "postgres"]
    exists = subprocess.run(
        [*psql, "-tAc", f"SELECT 1 FROM pg_database WHERE datname = '{dbname}'"],  # noqa: S608 - checked above
        capture_output=True,
        text=True,
    )
    if exists.returncode == 0 and exists.stdout.strip() != "1":
        exists = subprocess.run(
            [*psql, "-qc", f'CREATE DATABASE "{dbname}"'], capture_output=True, text=True
        )
    if exists.returncode != 0:
        said = exists.stderr.strip().splitlines()
        raise ServerFailed(
            f"PostgreSQL on 127.0.0.1:{port} refused the database {dbname!r}: "
            f"{said[-1] if said else 'psql failed'} (log: {log})"
        )
    return f"postgres://{PG_USER}@127.0.0.1:{port}/{dbname}"


def stop_postgres(root: Path) -> None:
    data = pg_home(root) / "postgres"
    if (data / "postmaster.pid").exists():
        subprocess.run(
            as_server_user([pg_bin("pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"]),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )


def start_redis(root: Path, port: int, aof: bool = False) -> str:
    """Start Redis unless a Redis answers on ``port``.

    ``aof``: append-only file with fsync every second, the persistence `make run` and
    production use (docs/reliability.md): a restart keeps queued messages, a crash loses
    at most the last second. Throwaway test servers keep nothing.
    """
    data = root / "redis"
    data.mkdir(parents=True, exist_ok=True)
    pidfile = data / "redis.pid"
    log = data / "redis.log"
    if port_open(port):
        if not answers_as_redis(port):
            raise ServerFailed(
                f"Redis cannot start: 127.0.0.1:{port} is taken by a program that is not "
                "Redis (DEV_REDIS_PORT chooses another port)"
            )
        return f"redis://127.0.0.1:{port}/0"
    server = shutil.which("redis-server")
    if not server:
        raise ServerFailed("redis-server not found: apt-get install redis-server")
    since = log_size(log)
    # Not --daemonize: as our child, a server that exits at once (a port taken, a bad
    # option) is seen at once, not after a wait for its port. Its own session keeps it
    # out of the caller's Ctrl-C; `stop` signals it by its pid file.
    with log.open("ab") as output:
        server_process = subprocess.Popen(
            [
                server,
                "--port",
                str(port),
                "--bind",
                "127.0.0.1",
                "--dir",
                str(data),
                "--pidfile",
                str(pidfile),
                "--logfile",
                str(log),
                "--save",
                "",
                "--appendonly",
                "yes" if aof else "no",
                "--appendfsync",
                "everysec",
                "--protected-mode",
                "yes",
            ],
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=output,
            start_new_session=True,
        )
    deadline = time.monotonic() + 60
    while not port_open(port):
        if server_process.poll() is not None:
            raise failed(f"Redis did not start on 127.0.0.1:{port}", log, since)
        if time.monotonic() > deadline:
            raise failed(f"Redis did not open 127.0.0.1:{port} within 60 s", log, since)
        time.sleep(0.05)
    return f"redis://127.0.0.1:{port}/0"


def answers_as_redis(port: int) -> bool:
    with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
        sock.sendall(b"PING\r\n")
        try:
            answer = sock.recv(64)
        except OSError:
            return False
    # -NOAUTH / -ERR: a Redis with a password or other rules, still a Redis.
    return answer.startswith((b"+PONG", b"-NOAUTH", b"-ERR"))


def running(pid: int) -> bool:
    """Whether process ``pid`` runs. One that exited but is not yet reaped (a zombie: a
    server this process started as its child, stopped) has ended; when it is our child it
    is reaped here, so that its pid is not held."""
    with contextlib.suppress(ChildProcessError):  # not ours: its own parent reaps it
        os.waitpid(pid, os.WNOHANG)
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


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
    while time.monotonic() < deadline and running(pid):
        time.sleep(0.05)


def start_pgbouncer(root: Path, port: int, pg_port: int, pool: int) -> None:
    """PgBouncer in transaction mode in front of PostgreSQL, ``pool`` server connections
    per database: how a fleet of workers on many hosts shares PostgreSQL. Runs as the
    server account (PgBouncer refuses root too)."""
    server = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
    if not Path(server).exists():
        raise ServerFailed("pgbouncer not found: apt-get install pgbouncer")
    data = pg_home(root) / "pgbouncer"
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
    pidfile = pg_home(root) / "pgbouncer" / "pgbouncer.pid"
    try:
        pid = int(pidfile.read_text().strip())
        if b"pgbouncer" in Path(f"/proc/{pid}/cmdline").read_bytes():
            os.kill(pid, signal.SIGTERM)
    except (FileNotFoundError, ValueError, ProcessLookupError):
        return


def wait_healthy(url: str, timeout: float, pid: int | None) -> None:
    """Poll ``url`` until it answers 200; give up after ``timeout`` seconds, or as soon as
    process ``pid`` (what serves it) has exited."""
    deadline = time.monotonic() + timeout
    last = "no answer"
    while time.monotonic() < deadline:
        if pid is not None and not running(pid):
            raise ServerFailed(f"the processes stopped before {url} answered: see above")
        try:
            with urllib.request.urlopen(url, timeout=5) as response:  # noqa: S310 - our loopback URL
                print(f"healthy: {response.read().decode(errors='replace')}")
                return
        except urllib.error.HTTPError as answer:
            last = f"{answer.code}: {answer.read().decode(errors='replace')}"
        except OSError as problem:
            last = str(problem)
        time.sleep(0.25)  # polling other processes' start-up: nothing to wait on instead
    try:
        failing = json.loads(last.split(": ", 1)[1])["failing"]
        last = "failing: " + ", ".join(failing)
    except (IndexError, ValueError, KeyError, TypeError):
        pass
    raise ServerFailed(f"{url} not healthy after {timeout:g} s ({last})")


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
    start.add_argument(
        "--pg-option",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a PostgreSQL server setting, after ours (repeatable), such as "
        "shared_preload_libraries=pg_stat_statements; a server already running keeps its own",
    )
    start.add_argument("--no-postgres", action="store_true")
    start.add_argument("--no-redis", action="store_true")
    stop = sub.add_parser("stop", help="stop the servers started in --dir")
    stop.add_argument("--dir", required=True, type=Path)
    remove = sub.add_parser(
        "remove", help="stop them and delete --dir and their data, wherever it lives"
    )
    remove.add_argument("--dir", required=True, type=Path)
    healthy = sub.add_parser("wait-healthy", help="wait until a /healthz URL answers 200")
    healthy.add_argument("--url", required=True)
    healthy.add_argument("--timeout", type=float, default=60.0)
    healthy.add_argument("--pid", type=int, help="stop waiting when this process exits")
    args = parser.parse_args()

    try:
        if args.command == "wait-healthy":
            wait_healthy(args.url, args.timeout, args.pid)
        else:
            run(args, args.dir.resolve())
    except ServerFailed as problem:
        sys.exit(str(problem))
    except (OSError, subprocess.SubprocessError) as problem:
        sys.exit(f"local servers: {problem}")


def run(args: argparse.Namespace, root: Path) -> None:
    """`start`, `stop` or `remove`."""
    if args.command in ("stop", "remove"):
        stop_pgbouncer(root)
        stop_postgres(root)
        stop_redis(root)
        if args.command == "remove":
            shutil.rmtree(pg_home(root), ignore_errors=True)
            shutil.rmtree(root, ignore_errors=True)
        return
    if not args.no_postgres:
        pg_port = args.pg_port or free_port()
        url = start_postgres(root, pg_port, args.db, args.fast, tuple(args.pg_option))
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
