"""Wake-ups for the live event streams of runs (``GET /api/v1/runs/{id}/events/stream``,
api/streams.py; docs/api.md, "A run's event stream").

PostgreSQL holds the events; a stream reads them from there. Redis only tells a stream
when to look: after a transaction that wrote events of a run commits, one tiny message on
that run's channel (``channel``). Publishing one for every step of every run would put a
Redis round trip on the engine's hot path (a step costs under a millisecond), so only
runs that someone streams are announced:

- a stream registers its run as watched (``watch``): a member of one sorted set, scored
  by when the registration lapses, renewed at each of its heartbeats;
- every process that writes events (workers, the web) keeps a copy of that set, read
  again at most once every ``REFRESH_S`` (``_watched``), and ``events_written`` looks the
  run up there: for a run nobody watches it costs a set lookup, never a round trip;
- for a watched run it publishes after commit, once per transaction and run (however
  many events the transaction wrote), or at once outside a transaction (the statement
  has committed).

A new stream may go unseen by a writer for up to ``REFRESH_S``, and a wake-up lost with
Redis is lost: a stream therefore reads PostgreSQL again once ``REFRESH_S`` after it
registered and at every heartbeat, so an event is at worst late, never missed. A Redis
that is down costs the wake-ups (logged once per outage), never a write.

The streams an organization has open are counted here too, for its quota
(``StreamLease``, a ``common.leases.Lease``; docs/tenants.md, "Quotas"): one sorted set
per organization, a member per open stream scored by when its lease lapses, renewed at
each heartbeat and removed when the stream closes. A web process that dies leaves its
streams' leases behind; they lapse and count no more.

This module is the shared leaf's: both ``runs`` (transitions, the engine) and
``orchestrator`` write events, and both may import it. It names no app.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import redis
from django.db import connection, transaction

from common import leases

logger = logging.getLogger(__name__)

PREFIX = "orchestrator:events:"
# Sorted set: run id -> when its watch lapses (Unix seconds; shared by every host).
WATCHED = PREFIX + "watched"
# How stale a writer's copy of the watched runs may be, in seconds.
REFRESH_S = 1.0
# After Redis failed to answer, how long a writer goes on with the copy it has.
RETRY_AFTER_FAILURE_S = 5.0


def channel(run_id: object) -> str:
    """The Redis channel a run's streams listen on."""
    return f"{PREFIX}run:{run_id}"


# --------------------------------------------------------------------------- streams
def lapse_after(heartbeat_s: float) -> float:
    """How long a stream's registrations (its run's watch, its lease) last unrenewed:
    two heartbeats may be late before they lapse."""
    return 2 * heartbeat_s + 10


def watch(run_id: object, ttl_s: float) -> None:
    """Register ``run_id`` as watched for ``ttl_s`` seconds (a stream renews it at each
    heartbeat), and drop the registrations that lapsed. Raises ``redis.RedisError``."""
    now = time.time()
    with leases.quick_client().pipeline(transaction=False) as pipe:
        pipe.zadd(WATCHED, {str(run_id): now + ttl_s})
        pipe.zremrangebyscore(WATCHED, "-inf", now)
        pipe.execute()


# --------------------------------------------------------------------------- writers
@dataclass
class _Copy:
    """This process's copy of the watched runs, and when to read it again."""

    runs: frozenset[str] = frozenset()
    refresh_at: float = 0.0  # time.monotonic()
    failing: bool = False


_copy = _Copy()


def _watched() -> frozenset[str]:
    """The watched runs, read from Redis at most once every ``REFRESH_S``. Concurrent
    readers (threads, greenlets) may both refresh; either answer will do."""
    now = time.monotonic()
    if now < _copy.refresh_at:
        return _copy.runs
    _copy.refresh_at = now + REFRESH_S
    try:
        members = leases.quick_client().zrangebyscore(WATCHED, time.time(), "+inf")
    except (redis.RedisError, OSError) as exc:
        if not _copy.failing:
            logger.warning("live event streams get no wake-ups: Redis: %s", exc)
        _copy.failing = True
        _copy.refresh_at = now + RETRY_AFTER_FAILURE_S
        return _copy.runs
    if _copy.failing:
        logger.warning("live event streams get their wake-ups again")
    _copy.failing = False
    _copy.runs = frozenset(member.decode() for member in members)
    return _copy.runs


@dataclass
class _Batch:
    """The watched runs that one transaction wrote events of, announced on its commit.

    ``hooks`` is the list of commit callbacks the batch was registered into. Django
    replaces that list with a new one whenever its callbacks run or are discarded (a
    commit, a rollback, a savepoint's rollback), so a batch whose list is no longer the
    connection's belongs to a transaction that is over, or may have been dropped with a
    savepoint: the next write starts a new batch. (At worst a run is announced twice.)
    """

    hooks: list[Any]
    runs: set[str] = field(default_factory=set)

    def publish(self) -> None:
        publish(self.runs)


_local = threading.local()  # per thread, and per greenlet in the gevent web


def events_written(run_id: object) -> None:
    """Events of ``run_id`` were written in the current transaction (or have just been
    committed, outside one): wake its streams once it commits, if it has any."""
    watched = _watched()
    if not watched:  # the common case, on the engine's hot path: nothing else to do
        return
    key = str(run_id)
    if key not in watched:
        return
    if not connection.in_atomic_block:
        publish([key])  # autocommit: the statement that wrote them has committed
        return
    batch: _Batch | None = getattr(_local, "batch", None)
    if batch is None or batch.hooks is not connection.run_on_commit:
        batch = _Batch(hooks=connection.run_on_commit)
        _local.batch = batch
        transaction.on_commit(batch.publish)
    batch.runs.add(key)


def publish(run_ids: Iterable[str]) -> None:
    """Wake the streams of ``run_ids`` (after commit). Never raises: the events are in
    PostgreSQL, and a stream reads them at its next heartbeat if the wake-up is lost."""
    channels = [channel(run_id) for run_id in run_ids]
    if not channels:
        return
    try:
        with leases.quick_client().pipeline(transaction=False) as pipe:
            for name in channels:
                pipe.publish(name, b"1")
            pipe.execute()
    except (redis.RedisError, OSError) as exc:
        logger.warning("event stream wake-up not published for %d run(s): %s", len(channels), exc)


# --------------------------------------------------------------------------- open streams
def _open_key(organization_id: object) -> str:
    """The sorted set of an organization's open streams: stream id -> when its lease
    lapses (Unix seconds, as the watches)."""
    return f"{PREFIX}open:{organization_id}"


class StreamLease(leases.Lease):
    """One open stream's place among its organization's (its quota `event_streams`).

    Without Redis nothing is counted: a stream opens anyway (it works without Redis, as
    its wake-ups do: an outage slows streams down, it refuses none), and its renewal at
    the next heartbeat after Redis is back counts it again."""

    def __init__(self, organization_id: object, ttl_s: float) -> None:
        super().__init__(_open_key(organization_id), ttl_s, what="event stream")
        self.organization_id = organization_id


def streams_open(organization_id: object) -> int:
    """How many streams the organization has open (leases not lapsed); 0 when Redis does
    not answer (nothing is counted then)."""
    return leases.held(_open_key(organization_id))
