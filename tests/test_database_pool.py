"""The web's connection pool is back with its database, not minutes after it.

psycopg_pool retries a lost connection with a doubling delay for `reconnect_timeout`
(its default 300 s). make chaos-net found the cost: after a web host was cut off for
30 s, its pool's next tries came a minute apart and every request was answered 503 long
after PostgreSQL was reachable again. The settings give a lost connection up after
DATABASE_POOL_RECONNECT_S, and the next request that needs one opens it. Here a pool
with the settings' options reaches the test database through a forwarder that is down,
then up: the first request after it is up gets a connection at once.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.db import connection
from psycopg import Connection
from psycopg_pool import ConnectionPool

from config.settings.database import database_config


class Forwarder:
    """A TCP port on 127.0.0.1 that refuses connections until ``up()``, then forwards
    them to ``target``."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        self.port = probe.getsockname()[1]
        probe.close()  # nothing listens: a connection is refused at once
        self.listener: socket.socket | None = None
        self.sockets: list[socket.socket] = []

    def up(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", self.port))
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        for sock in [self.listener, *self.sockets]:
            if sock is not None:
                sock.close()

    def _accept(self) -> None:
        assert self.listener is not None
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            self.sockets += [client, server]
            for source, sink in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(source, sink), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            sink.close()


@contextmanager
def pool_through(forwarder: Forwarder, options: dict[str, Any]) -> Iterator[ConnectionPool]:
    params = connection.get_connection_params()
    params.update(host="127.0.0.1", port=forwarder.port, connect_timeout=2)
    params.pop("pool", None)
    params.pop("cursor_factory", None)
    params.pop("context", None)
    pool: ConnectionPool[Connection[Any]] = ConnectionPool(
        kwargs=params, open=False, check=ConnectionPool.check_connection, **options
    )
    pool.open(wait=False)
    try:
        yield pool
    finally:
        pool.close(timeout=1)


def wait_until(condition: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@pytest.mark.django_db
def test_a_pool_whose_database_was_away_gets_a_connection_as_soon_as_it_is_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DATABASE_POOL_SIZE", "4")
    options = database_config("postgres://u:p@127.0.0.1:5432/db")["OPTIONS"]["pool"]
    assert options["reconnect_timeout"] == 5  # DATABASE_POOL_RECONNECT_S's default
    # Shortened here, so that the outage outlasts it within a second or two. With the
    # default 300 s the pool keeps its connection in a doubling backoff (the next tries
    # 3, 7, 15 s in) and never gives it up here.
    options = {**options, "reconnect_timeout": 1}
    forwarder = Forwarder((connection.settings_dict["HOST"], int(connection.settings_dict["PORT"])))
    try:
        with pool_through(forwarder, options) as pool:
            # Down: the pool tries, fails, and gives its connection up.
            wait_until(lambda: pool.get_stats().get("connections_errors", 0) >= 2, 10)
            wait_until(lambda: pool.get_stats()["pool_size"] == 0, 10)
            forwarder.up()
            started = time.monotonic()
            with pool.connection(timeout=2) as conn:
                assert conn.execute("SELECT 1").fetchone() == (1,)
            assert time.monotonic() - started < 2
    finally:
        forwarder.close()
