"""How every process reaches its stores, from URLs alone (docs/architecture.md, "Across
hosts"): Redis at one address or through Redis Sentinel, PostgreSQL at one host or at
several in libpq's multi-host form.

Redis. ``CELERY_BROKER_URL`` is the one entry: ``redis://`` or ``rediss://`` for one
server, or kombu's Sentinel form, ``sentinel://[:password@]host:port/db`` once per
Sentinel joined by ``;``, with the group's name in ``REDIS_SENTINEL_MASTER``. Celery
(broker and results) reads it through kombu's and Celery's own Sentinel support; the
project's own clients (throttling, metrics, doorbells, event streams, runner polls,
beat's tick) through ``redis_client``, which asks the Sentinels for the current primary
on every new connection, so a client follows a failover when its connection breaks.

PostgreSQL. ``postgres://user@db1:5432,db2:5432/name?target_session_attrs=read-write``
is handed to libpq as ``host=db1,db2 port=5432,5432``: libpq tries the hosts in order
and, with ``target_session_attrs=read-write``, takes the one that accepts writes, so a
connection opened after a promotion reaches the new primary.
"""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

import redis
from redis.sentinel import Sentinel

SENTINEL_SCHEME = "sentinel"

# TCP keepalives on every Redis connection: a consumer blocked on a primary whose host
# vanished (no reset ever comes) notices within about 11 s, not after TCP's own timers
# (a worker's consumer sat on one for 110 s in make cluster's Redis failover); and data
# left unacknowledged for 10 s drops the connection.
# (Linux's names; a platform without one of them goes without that timer.)
KEEPALIVE_OPTIONS: dict[int, int] = {
    getattr(socket, name): value
    for name, value in (
        ("TCP_KEEPIDLE", 5),
        ("TCP_KEEPINTVL", 2),
        ("TCP_KEEPCNT", 3),
        ("TCP_USER_TIMEOUT", 10_000),
    )
    if hasattr(socket, name)
}


@dataclass(frozen=True)
class SentinelTarget:
    """A Redis primary found through Sentinels: their addresses, the primary's database
    and credentials (the Sentinels themselves are asked without them)."""

    sentinels: tuple[tuple[str, int], ...]
    db: int = 0
    username: str | None = None
    password: str | None = None


# A URL's password: what follows `user:` up to the `@` before the host (greedy: a
# password may hold an `@` a hand-written URL did not encode).
_PASSWORD = re.compile(r"(://[^/@:;]*:)[^/;]*@")


def without_password(url: str) -> str:
    """``url`` as an error or a log may show it: each password replaced by ``***``
    (``redis://:***@host:6379/0``; every URL of a ``;``-joined list)."""
    return _PASSWORD.sub(r"\1***@", url)


def is_sentinel(url: str) -> bool:
    return url.strip().lower().startswith(f"{SENTINEL_SCHEME}://")


def parse_sentinel(url: str) -> SentinelTarget:
    """``sentinel://[:password@]host:port/db;sentinel://host:port/db...`` -> its target;
    ValueError naming what is wrong. The database and credentials are the first URL's
    that gives them (kombu reads them from the first); every URL must be a Sentinel's."""
    sentinels: list[tuple[str, int]] = []
    db: int | None = None
    username = password = None
    for part in url.split(";"):
        part = part.strip()
        if not part:
            continue
        parts = urlsplit(part)
        shown = repr(without_password(part))  # an error never repeats a password
        if parts.scheme != SENTINEL_SCHEME:
            raise ValueError(f"{shown} is not a sentinel:// URL (join Sentinels with ';')")
        try:
            port = parts.port or 26379
        except ValueError:
            raise ValueError(f"{shown} has no valid port") from None
        if not parts.hostname:
            raise ValueError(f"{shown} names no host")
        sentinels.append((parts.hostname, port))
        path = parts.path.strip("/")
        if path and db is None:
            if not path.isdigit():
                raise ValueError(f"{shown}: the database must be a number, got {path!r}")
            db = int(path)
        if parts.password is not None and password is None:
            username = unquote(parts.username) if parts.username else None
            password = unquote(parts.password)
    if not sentinels:
        raise ValueError("no Sentinel given")
    return SentinelTarget(tuple(sentinels), db or 0, username, password)


def redis_client(
    url: str, *, master: str, socket_timeout: float, socket_connect_timeout: float
) -> redis.Redis[bytes]:
    """A client of the Redis at ``url``: ``redis.Redis.from_url`` for one server; through
    Sentinel the group ``master``'s current primary, looked up again whenever a
    connection is opened (a failover breaks the old ones: the next command reconnects
    to the new primary). Nothing connects until the first command."""
    timeouts: dict[str, Any] = {
        "socket_timeout": socket_timeout,
        "socket_connect_timeout": socket_connect_timeout,
        **keepalive_options(),
    }
    if not is_sentinel(url):
        return redis.Redis.from_url(url, **timeouts)
    target = parse_sentinel(url)
    # The Sentinels are asked with the same short timeouts: a dead one is skipped fast.
    sentinel = Sentinel(list(target.sentinels), sentinel_kwargs=dict(timeouts), **timeouts)
    client: redis.Redis[bytes] = sentinel.master_for(
        master, db=target.db, username=target.username, password=target.password, **timeouts
    )
    return client


def celery_sentinel_options(master: str, socket_timeout: float) -> dict[str, Any]:
    """The transport options kombu's and Celery's Sentinel support need beside the URL:
    the group's name, and the Sentinels' own timeouts."""
    return {
        "master_name": master,
        "sentinel_kwargs": {"socket_timeout": socket_timeout, "socket_connect_timeout": 2},
    }


def keepalive_options() -> dict[str, Any]:
    """kombu's and Celery's Redis transport options for ``KEEPALIVE_OPTIONS``."""
    return {"socket_keepalive": True, "socket_keepalive_options": dict(KEEPALIVE_OPTIONS)}


# --------------------------------------------------------------------------- PostgreSQL
@dataclass(frozen=True)
class PostgresHosts:
    """A multi-host URL taken apart: the URL with its first host alone (for the
    settings' parser) and libpq's comma-separated ``host`` and ``port``."""

    single_url: str
    host: str
    port: str


def postgres_hosts(url: str, default_port: int = 5432) -> PostgresHosts | None:
    """``postgres://user@db1:5432,db2:5433/name?...`` -> its hosts; None for a URL of one
    host. ValueError for an empty host or a port that is not a number."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return None
    netloc, slash, tail = rest.partition("/")
    userinfo, at, hostlist = netloc.rpartition("@")
    if "," not in hostlist:
        return None
    hosts, ports = [], []
    for item in hostlist.split(","):
        host, port = _host_port(item.strip(), default_port)
        if not host:
            raise ValueError(f"DATABASE_URL has an empty host in {hostlist!r}")
        if not port.isdigit():
            raise ValueError(f"DATABASE_URL: port {port!r} of {host!r} is not a number")
        hosts.append(host)
        ports.append(port)
    first = f"[{hosts[0]}]" if ":" in hosts[0] else hosts[0]
    single = f"{scheme}://{userinfo}{at}{first}:{ports[0]}{slash}{tail}"
    return PostgresHosts(single, ",".join(hosts), ",".join(ports))


def _host_port(item: str, default_port: int) -> tuple[str, str]:
    """``host[:port]`` or ``[v6]:port`` -> (host, port), the default port when none."""
    if item.startswith("["):
        host, _, rest = item[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    else:
        host, _, port = item.partition(":")
    return host, port or str(default_port)


def broker_redis(
    *, socket_timeout: float, socket_connect_timeout: float, url: str | None = None
) -> redis.Redis[bytes]:
    """``redis_client`` for the broker's Redis (``CELERY_BROKER_URL``, or ``url``), the
    one the project's own clients share with Celery."""
    from django.conf import settings

    return redis_client(
        url or settings.CELERY_BROKER_URL,
        master=settings.REDIS_SENTINEL_MASTER,
        socket_timeout=socket_timeout,
        socket_connect_timeout=socket_connect_timeout,
    )
