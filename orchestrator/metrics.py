"""Prometheus metrics (`GET /metrics`, api/metrics.py; README, Metrics).

Where each figure comes from, and why:

- **What processes count** (step attempts by tool and outcome, step duration and queue
  wait by tool, sweep actions, API requests by route and status) is added to hashes in
  the broker's Redis, one pipelined round trip per event. Workers run on several hosts,
  each with several processes, and the web has its own: prometheus_client's multiprocess
  mode shares one directory between the processes of one host only, and a scrape of one
  web process would see none of the workers' figures. Redis is shared by every process
  already; counters there survive a process's restart (a Redis that loses its data
  resets them, which Prometheus reads as a counter reset). A Redis that is down loses
  those increments, never the work: the engine's state is PostgreSQL's.
- **What the database holds** (runs by status, ledger movements) is read from it at
  scrape time, and **queue depths** from the broker, as they are now.

The exposition is rendered by prometheus_client from custom collectors, never from its
process-global registry.
"""

from __future__ import annotations

import bisect
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import redis
from django.conf import settings
from django.db import connection
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from common import eventstreams
from common.stores import broker_redis
from config.celery import ALL_QUEUES

logger = logging.getLogger(__name__)

PREFIX = "orchestrator:metrics:"
STEPS = PREFIX + "steps"  # "tool|outcome" -> attempts
DURATION = PREFIX + "step_duration"  # "tool|bucket index", "tool|sum", "tool|count"
QUEUE_WAIT = PREFIX + "step_queue_wait"  # the same
SWEEPS = PREFIX + "sweeps"  # "sweep|action" -> count
API = PREFIX + "api"  # "route|method|status" -> requests
DOORBELLS = PREFIX + "doorbells"  # "rung|reason" -> sent; "answered|outcome" -> received
RATE_LIMITS = PREFIX + "rate_limits"  # "granted|limit" -> units; "waits|limit" -> waits
RATE_LIMIT_WAIT = PREFIX + "rate_limit_wait"  # "limit|bucket index", "limit|sum", "limit|count"
# Seconds: a no-op step takes milliseconds, an LLM call or a runner's job minutes.
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900)
SEP = "|"


def new_client() -> redis.Redis[bytes]:
    """A client of the broker's Redis with short timeouts (metrics are never worth a wait)."""
    return broker_redis(socket_timeout=1, socket_connect_timeout=1)


_client: redis.Redis[bytes] | None = None


def _connection() -> redis.Redis[bytes]:
    global _client
    if _client is None:
        _client = new_client()
    return _client


def _add(increments: Iterable[tuple[str, str, float]]) -> None:
    """HINCRBY / HINCRBYFLOAT each (hash, field, amount) in one round trip; a Redis that
    is down loses them (logged), never the caller's work."""
    try:
        pipe = _connection().pipeline(transaction=False)
        for key, field, amount in increments:
            if isinstance(amount, int):
                pipe.hincrby(key, field, amount)
            else:
                pipe.hincrbyfloat(key, field, amount)
        pipe.execute()
    except (redis.RedisError, OSError) as exc:
        logger.warning("metrics not recorded: %s", exc)


def _observation(key: str, label: str, seconds: float) -> list[tuple[str, str, float]]:
    bucket = bisect.bisect_left(BUCKETS, seconds)  # len(BUCKETS): the +Inf bucket
    return [
        (key, f"{label}{SEP}{bucket}", 1),
        (key, f"{label}{SEP}sum", float(seconds)),
        (key, f"{label}{SEP}count", 1),
    ]


# A step's figures are summed in the process and sent at most once a second, by the
# step or by the worker's heartbeat thread (orchestrator.heartbeat) once the process is
# idle, never once per step or per task: a round trip to Redis for each cost the dag
# benchmark a tenth of its time.
FLUSH_EVERY_S = 1.0
_lock = threading.Lock()
_pending: dict[tuple[str, str], float] = defaultdict(float)
_flushed_at = 0.0


def step_attempt(tool: str, outcome: str, duration_s: float, queue_wait_s: float | None) -> None:
    """A step attempt ended (``outcome``: completed, failed, skipped, dropped)."""
    increments = [(STEPS, f"{tool}{SEP}{outcome}", 1), *_observation(DURATION, tool, duration_s)]
    if queue_wait_s is not None and queue_wait_s >= 0:
        increments += _observation(QUEUE_WAIT, tool, queue_wait_s)
    with _lock:
        for key, field, amount in increments:
            _pending[(key, field)] += amount
    flush_if_due()


def flush_if_due() -> None:
    if time.monotonic() - _flushed_at >= FLUSH_EVERY_S:
        flush()


def flush() -> None:
    """Send what this process summed (a Redis that is down loses it, logged)."""
    global _flushed_at
    with _lock:
        _flushed_at = time.monotonic()
        if not _pending:
            return
        # Sums are seconds (HINCRBYFLOAT); the rest are counts (HINCRBY).
        sending = [
            (key, field, amount if field.endswith(f"{SEP}sum") else int(amount))
            for (key, field), amount in _pending.items()
        ]
        _pending.clear()
    _add(sending)


def doorbells_rung(reason: str, count: int = 1) -> None:
    """Doorbells sent, by why (docs/engine.md: ready steps, a call for help, a burst's
    end, a run left with work, a replay, a revoke): summed like a step's figures."""
    _count(DOORBELLS, f"rung{SEP}{reason}", count)


def doorbell_answered(served: int) -> None:
    """A doorbell (or a pick-up serving as one) ended: it served steps, or it found
    none (``idle``: a message that woke a worker for nothing)."""
    _count(DOORBELLS, f"answered{SEP}{'served' if served else 'idle'}", 1)


def _count(key: str, field: str, count: int) -> None:
    with _lock:
        _pending[(key, field)] += count
    flush_if_due()


def rate_limit_granted(granted: Iterable[tuple[str, int]], waited_s: float | None) -> None:
    """Units granted to a step (by limit), and how long it waited in line for them."""
    increments: list[tuple[str, str, float]] = [
        (RATE_LIMITS, f"granted{SEP}{name}", units) for name, units in granted
    ]
    if waited_s is not None:
        for name, _ in granted:
            increments += _observation(RATE_LIMIT_WAIT, name, waited_s)
    with _lock:
        for key, field, amount in increments:
            _pending[(key, field)] += amount
    flush_if_due()


def rate_limit_wait(name: str) -> None:
    """A step went to wait for ``name``'s units."""
    _count(RATE_LIMITS, f"waits{SEP}{name}", 1)


def sweep_actions(sweep: str, counts: dict[str, int]) -> None:
    """What a sweep did (its task's result), by action."""
    _add((SWEEPS, f"{sweep}{SEP}{action}", int(n)) for action, n in counts.items() if n)


def api_request(route: str, method: str, status: int) -> None:
    _add([(API, f"{route}{SEP}{method}{SEP}{status}", 1)])


# --------------------------------------------------------------------------- exposition
def _fields(raw: dict[bytes, bytes]) -> Iterator[tuple[list[str], str]]:
    for field, value in raw.items():
        yield field.decode().split(SEP), value.decode()


def _histogram(name: str, help_text: str, raw: dict[bytes, bytes], label: str = "tool") -> Metric:
    family = HistogramMetricFamily(name, help_text, labels=[label])
    per_tool: dict[str, dict[str, float]] = defaultdict(dict)
    for parts, value in _fields(raw):
        per_tool[parts[0]][parts[1]] = float(value)
    for tool, values in sorted(per_tool.items()):
        cumulative = 0.0
        buckets = []
        for index, bound in enumerate((*BUCKETS, float("inf"))):
            cumulative += values.get(str(index), 0.0)
            buckets.append((floatToGoString(bound), cumulative))  # type: ignore[no-untyped-call]
        family.add_metric([tool], buckets, values.get("sum", 0.0))
    return family


class OrchestratorCollector(Collector):
    """Every metric of the orchestrator, read at each scrape."""

    def collect(self) -> Iterator[Metric]:
        yield from self._database()
        yield from self._redis()

    def _database(self) -> Iterator[Metric]:
        runs = GaugeMetricFamily(
            "orchestrator_runs", "Runs by status (child runs included).", labels=["status"]
        )
        entries = CounterMetricFamily(
            "orchestrator_ledger_entries", "Ledger movements by type.", labels=["type"]
        )
        credits = CounterMetricFamily(
            "orchestrator_ledger_credits", "Credits moved, by ledger entry type.", labels=["type"]
        )
        with connection.cursor() as cursor:
            cursor.execute("SELECT status, count(*) FROM runs_run GROUP BY status")
            for status, count in cursor.fetchall():
                runs.add_metric([status], count)
            cursor.execute(
                "SELECT type, count(*), COALESCE(sum(amount), 0) FROM billing_ledgerentry "
                "GROUP BY type"
            )
            for kind, count, amount in cursor.fetchall():
                entries.add_metric([kind], count)
                credits.add_metric([kind], float(amount))
            # The partial index step_rate_waiting holds exactly these rows.
            cursor.execute(
                "SELECT waiting_reason, count(*) FROM runs_step "
                "WHERE waiting_reason <> '' AND status = 'pending' GROUP BY waiting_reason"
            )
            waiting = GaugeMetricFamily(
                "orchestrator_rate_limit_waiting_steps",
                "Steps waiting for a rate limit's units now, by limit.",
                labels=["limit"],
            )
            for reason, count in cursor.fetchall():
                waiting.add_metric([reason.removeprefix("rate_limited:")], count)
        yield from (runs, entries, credits, waiting)

    def _redis(self) -> Iterator[Metric]:
        client = _connection()
        try:
            pipe = client.pipeline(transaction=False)
            for key in (STEPS, DURATION, QUEUE_WAIT, SWEEPS, API, DOORBELLS, RATE_LIMITS,
                        RATE_LIMIT_WAIT):  # fmt: skip
                pipe.hgetall(key)
            ask_queue_depths(pipe)
            pipe.zrangebyscore(eventstreams.WATCHED, time.time(), "+inf")
            results: list[Any] = pipe.execute()
            watched = [member.decode() for member in results[-1]]
            # Every open stream subscribes to its run's channel (api/streams.py).
            channels = [eventstreams.channel(run_id) for run_id in watched]
            subscribers = client.pubsub_numsub(*channels) if channels else []
        except (redis.RedisError, OSError) as exc:
            logger.warning("metrics from Redis unavailable: %s", exc)
            yield _redis_up(0)
            return
        steps, duration, queue_wait, sweeps, api, doorbells, rate, rate_wait = results[:8]
        yield _redis_up(1)

        attempts = CounterMetricFamily(
            "orchestrator_step_attempts",
            "Step attempts that ended, by tool and outcome.",
            labels=["tool", "outcome"],
        )
        for parts, value in _fields(steps):
            attempts.add_metric(parts[:2], float(value))
        yield attempts
        yield _histogram(
            "orchestrator_step_duration_seconds", "Time a step attempt ran, by tool.", duration
        )
        yield _histogram(
            "orchestrator_step_queue_wait_seconds",
            "Time from a step's dispatch (or its retry's) to its claim by a worker, by tool.",
            queue_wait,
        )
        actions = CounterMetricFamily(
            "orchestrator_sweep_actions",
            "What the periodic sweeps did (reclaimed, timed out, re-dispatched...).",
            labels=["sweep", "action"],
        )
        for parts, value in _fields(sweeps):
            actions.add_metric(parts[:2], float(value))
        yield actions
        requests = CounterMetricFamily(
            "orchestrator_api_requests",
            "API requests by route, method and status.",
            labels=["route", "method", "status"],
        )
        for parts, value in _fields(api):
            requests.add_metric(parts[:3], float(value))
        yield requests
        rung = CounterMetricFamily(
            "orchestrator_doorbells_rung",
            "Doorbell messages sent to wake a worker for a run's ready steps, by reason.",
            labels=["reason"],
        )
        answered = CounterMetricFamily(
            "orchestrator_doorbells_answered",
            "Doorbells a worker answered: served steps, or found none ready (idle).",
            labels=["outcome"],
        )
        for parts, value in _fields(doorbells):
            (rung if parts[0] == "rung" else answered).add_metric(parts[1:2], float(value))
        yield from (rung, answered)
        granted = CounterMetricFamily(
            "orchestrator_rate_limit_units_granted",
            "Units granted to steps, by rate limit.",
            labels=["limit"],
        )
        waits = CounterMetricFamily(
            "orchestrator_rate_limit_waits",
            "Times a step went to wait for a rate limit's units, by limit.",
            labels=["limit"],
        )
        for parts, value in _fields(rate):
            (granted if parts[0] == "granted" else waits).add_metric(parts[1:2], float(value))
        yield from (granted, waits)
        yield _histogram(
            "orchestrator_rate_limit_wait_seconds",
            "Time a step waited in line for its rate limits' units, by limit.",
            rate_wait,
            label="limit",
        )
        depth = GaugeMetricFamily(
            "orchestrator_queue_depth", "Messages waiting in each Celery queue.", labels=["queue"]
        )
        for queue, waiting in queue_depths_in(results[8:-1]).items():
            depth.add_metric([queue], float(waiting))
        yield depth
        streams = GaugeMetricFamily(
            "orchestrator_event_streams", "Runs' event streams open, every web process's."
        )
        streams.add_metric([], float(sum(count for _, count in subscribers)))
        runs = GaugeMetricFamily(
            "orchestrator_event_streams_watched_runs", "Runs that event streams follow."
        )
        runs.add_metric([], float(len(watched)))
        yield from (streams, runs)


def _redis_up(value: int) -> GaugeMetricFamily:
    up = GaugeMetricFamily("orchestrator_metrics_redis_up", "Redis answered the scrape.")
    up.add_metric([], value)
    return up


def ask_queue_depths(pipe: Any) -> None:
    """Add to a Redis pipeline the LLEN of every list of every Celery queue
    (``queue_depths_in`` reads the answers)."""
    for queue in ALL_QUEUES:
        for key in queue_keys(queue):
            pipe.llen(key)


def queue_depths_in(answers: Sequence[int]) -> dict[str, int]:
    """Messages waiting per queue, from the answers ``ask_queue_depths`` asked for (in
    its order, first in the pipeline's answers)."""
    depths, index = {}, 0
    for queue in ALL_QUEUES:
        count = len(queue_keys(queue))
        depths[queue] = sum(answers[index : index + count])
        index += count
    return depths


def queue_keys(queue: str) -> list[str]:
    """The Redis lists of a queue: kombu keeps one per priority step (the first is the
    queue's own name)."""
    options: dict[str, Any] = settings.CELERY_BROKER_TRANSPORT_OPTIONS
    sep = options.get("sep", "\x06\x16")
    return [queue if step == 0 else f"{queue}{sep}{step}" for step in options["priority_steps"]]
