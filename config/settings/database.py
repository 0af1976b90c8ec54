"""PostgreSQL (docs/configuration.md, "Database"): the URL, one host or several, and
what each connection is given: timeouts, keepalives, a pool per process, prepared
statements."""

from __future__ import annotations

from typing import Any

import dj_database_url

from common.stores import postgres_hosts
from config.settings.environment import env

# --------------------------------------------------------------------------- database
DATABASE_URL = env.url(
    "DATABASE_URL",
    "postgres://orchestrator@127.0.0.1:55432/orchestrator",
    "PostgreSQL URL, postgres://user:password@host:port/name",
    schemes=("postgres", "postgresql", "pgsql"),
)


def server_session_options() -> dict[str, str]:
    """What the server side of each connection is told at its start (libpq's
    ``options``): a client cut off by the network while it holds row locks in an open
    transaction (a worker host partitioned mid-recording) would otherwise keep them until
    the server's own keepalives notice, two hours by default, and every sweep and
    recording of that run would wait on them. The server drops such a session after
    ``DATABASE_IDLE_IN_TRANSACTION_TIMEOUT_S`` idle in a transaction (nothing here idles
    inside one: tools run outside transactions) and probes a silent client like the
    client probes it. Behind PgBouncer in transaction mode (which refuses unknown startup
    parameters), set 0 and put these in postgresql.conf instead."""
    idle = env.integer(
        "DATABASE_IDLE_IN_TRANSACTION_TIMEOUT_S",
        30,
        "seconds the server lets a session idle inside a transaction (0: send no options)",
        minimum=0,
    )
    if not idle:
        return {}
    settings = {
        "idle_in_transaction_session_timeout": f"{idle}s",
        "tcp_keepalives_idle": "10",
        "tcp_keepalives_interval": "3",
        "tcp_keepalives_count": "3",
    }
    return {"options": " ".join(f"-c {name}={value}" for name, value in settings.items())}


def database_config(url: str) -> dict[str, Any]:
    # Several hosts (libpq's multi-host form, common.stores): parsed with the first host
    # alone, then libpq gets them all, in order.
    try:
        hosts = postgres_hosts(url)
    except ValueError as exc:
        env.errors.append(str(exc))
        hosts, url = None, ""  # refused above; parsed as a placeholder, never used
    config: dict[str, Any] = dict(
        dj_database_url.parse(
            (hosts.single_url if hosts else url) or "postgres://invalid/invalid",
            conn_max_age=env.integer(
                "DATABASE_CONN_MAX_AGE", 60, "seconds a connection is reused", minimum=0
            ),
            conn_health_checks=True,
        )
    )
    if hosts:
        config["HOST"], config["PORT"] = hosts.host, hosts.port
    # A host that dies without closing its connections (its link down, its machine
    # gone) is noticed in seconds, not after TCP's retransmissions (about 15 minutes):
    # keepalives for an idle connection, tcp_user_timeout for one whose data goes
    # unacknowledged. The URL's own parameters (target_session_attrs, sslmode, ...) win.
    config["OPTIONS"] = {
        "connect_timeout": env.integer(
            "DATABASE_CONNECT_TIMEOUT", 5, "seconds to wait for PostgreSQL", minimum=1
        ),
        "keepalives": 1,
        "keepalives_idle": env.integer(
            "DATABASE_KEEPALIVE_IDLE_S", 10, "idle seconds before TCP keepalives", minimum=1
        ),
        "keepalives_interval": 3,
        "keepalives_count": 3,
        "tcp_user_timeout": env.integer(
            "DATABASE_TCP_USER_TIMEOUT_MS",
            15000,
            "ms data may go unacknowledged before the connection is dropped (0: the OS's)",
            minimum=0,
        ),
        **server_session_options(),
        **config.get("OPTIONS", {}),
    }
    # A pool of connections per process (Django's psycopg pool), for the web process:
    # its gevent greenlets each need a connection for the length of a request, and
    # opening one per request halved the API's throughput (config/gunicorn.py).
    pool_size = env.integer(
        "DATABASE_POOL_SIZE", 0, "connections pooled per process (0: no pool)", minimum=0
    )
    if pool_size:
        config["CONN_MAX_AGE"] = 0  # the pool keeps them; Django refuses both
        config["OPTIONS"]["pool"] = {
            "min_size": 1,
            "max_size": pool_size,
            "timeout": 10,
            # psycopg_pool retries a lost connection with a doubling delay for as long as
            # this (its default 300 s): after a 30 s outage its next try came a minute
            # later, every connection of the pool waiting its turn, and requests were
            # answered 503 for minutes once the database was back (make chaos-net,
            # docs/reliability.md). Given up sooner, a connection is opened again by the
            # next request that needs one.
            "reconnect_timeout": env.integer(
                "DATABASE_POOL_RECONNECT_S",
                5,
                "seconds the pool retries a lost connection before leaving it to demand",
                minimum=1,
            ),
        }
    # Prepared statements: the engine's statements are large (data-modifying CTEs) and
    # PostgreSQL spent as long planning them as running them; prepared, a statement is
    # planned once per connection (psycopg prepares a query on its second execution,
    # which needs server-side parameter binding). Measured in docs/benchmark.md.
    if env.boolean(
        "DATABASE_PREPARED_STATEMENTS",
        True,
        "prepare repeated statements (off behind PgBouncer older than 1.21 in transaction mode)",
    ):
        config["OPTIONS"].update(server_side_binding=True, prepare_threshold=1)
    # Nothing else may outlive a transaction on its server connection, so that PgBouncer
    # in transaction mode can hand each transaction a different one (docs/benchmark.md):
    # no server-side cursors (an .iterator() would hold one). Prepared statements are
    # protocol-level (psycopg's Parse/Bind), which PgBouncer 1.21+ tracks across server
    # connections with max_prepared_statements; an older one needs them off.
    config["DISABLE_SERVER_SIDE_CURSORS"] = True
    return config


DATABASES = {"default": database_config(DATABASE_URL)}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
