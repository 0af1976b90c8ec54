"""What processes count for Prometheus (docs/operations.md, Metrics), kept in the
broker's Redis; the exposition, `GET /metrics`, is ``web.prometheus``.

Step attempts by tool and outcome, step duration and queue wait by tool, sweep actions,
API requests by route and status, doorbells, rate limits' grants and waits, webhook
attempts and schedule fires by outcome are added to hashes in Redis, one pipelined round
trip per event (a step's figures and the API's requests summed in the process first,
below). Workers run on several hosts, each with several processes, and the web has its
own: prometheus_client's multiprocess mode shares one directory between
the processes of one host only, and a scrape of one web process would see none of the
workers' figures. Redis is shared by every process already; counters there survive a
process's restart (a Redis that loses its data resets them, which Prometheus reads as a
counter reset). A Redis that is down loses those increments, never the work: the
engine's state is PostgreSQL's. The API and the worker both count here: the shared leaf."""

from __future__ import annotations

import bisect
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Iterable

import redis

from common.stores import broker_redis

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
WEBHOOK_ATTEMPTS = PREFIX + "webhook_attempts"  # "outcome" -> attempts
WEBHOOK_DISABLED = PREFIX + "webhook_disabled"  # "cause" -> endpoints the service disabled
SCHEDULE_FIRES = PREFIX + "schedule_fires"  # "kind|outcome" -> due times (or triggers)
# Seconds: a no-op step takes milliseconds, an LLM call or a runner's job minutes.
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900)
SEP = "|"


def new_client() -> redis.Redis[bytes]:
    """A client of the broker's Redis with short timeouts (metrics are never worth a wait)."""
    return broker_redis(socket_timeout=1, socket_connect_timeout=1)


_client: redis.Redis[bytes] | None = None


def connection() -> redis.Redis[bytes]:
    """This process's client (``new_client``), made on first use."""
    global _client
    if _client is None:
        _client = new_client()
    return _client


def _add(increments: Iterable[tuple[str, str, float]]) -> None:
    """HINCRBY / HINCRBYFLOAT each (hash, field, amount) in one round trip; a Redis that
    is down loses them (logged), never the caller's work."""
    try:
        pipe = connection().pipeline(transaction=False)
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
# step or by the worker's lease keeper thread (orchestrator.lease_keeper) once the process is
# idle, never once per step or per task: a round trip to Redis for each cost the dag
# benchmark a tenth of its time.
FLUSH_EVERY_S = 1.0
_lock = threading.Lock()
_pending: dict[tuple[str, str], float] = defaultdict(float)
_flushed_at = 0.0


def _sum(increments: Iterable[tuple[str, str, float]]) -> None:
    """Add to what this process sends at its next flush."""
    with _lock:
        for key, field, amount in increments:
            _pending[(key, field)] += amount
    flush_if_due()


def step_attempt(tool: str, outcome: str, duration_s: float, queue_wait_s: float | None) -> None:
    """A step attempt ended (``outcome``: completed, failed, skipped, dropped)."""
    increments = [(STEPS, f"{tool}{SEP}{outcome}", 1), *_observation(DURATION, tool, duration_s)]
    if queue_wait_s is not None and queue_wait_s >= 0:
        increments += _observation(QUEUE_WAIT, tool, queue_wait_s)
    _sum(increments)


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
    _sum([(DOORBELLS, f"rung{SEP}{reason}", count)])


def doorbell_answered(served: int) -> None:
    """A doorbell (or a pick-up serving as one) ended: it served steps, or it found
    none (``idle``: a message that woke a worker for nothing)."""
    _sum([(DOORBELLS, f"answered{SEP}{'served' if served else 'idle'}", 1)])


def rate_limit_granted(granted: Iterable[tuple[str, int]], waited_s: float | None) -> None:
    """Units granted to a step (by limit), and how long it waited in line for them."""
    increments: list[tuple[str, str, float]] = [
        (RATE_LIMITS, f"granted{SEP}{name}", units) for name, units in granted
    ]
    if waited_s is not None:
        for name, _ in granted:
            increments += _observation(RATE_LIMIT_WAIT, name, waited_s)
    _sum(increments)


def rate_limit_wait(name: str) -> None:
    """A step went to wait for ``name``'s units."""
    _sum([(RATE_LIMITS, f"waits{SEP}{name}", 1)])


def sweep_actions(sweep: str, counts: dict[str, int]) -> None:
    """What a sweep did (its task's result), by action."""
    _add((SWEEPS, f"{sweep}{SEP}{action}", int(n)) for action, n in counts.items() if n)


def api_request(route: str, method: str, status: int) -> None:
    """An API request answered: summed like a step's figures, not a round trip to Redis
    per request (make profile-api: about 0.2 ms of every request, a tenth of the
    cheapest). A web process has no lease keeper thread: the counts a quiet process holds
    go out a second later (``_flush_soon``)."""
    _sum([(API, f"{route}{SEP}{method}{SEP}{status}", 1)])
    _flush_soon()


_timer: threading.Timer | None = None


def _flush_soon() -> None:
    """Flush once FLUSH_EVERY_S from now, unless a flush is already due then: one timer
    (a greenlet under gevent) per process at a time."""
    global _timer
    with _lock:
        if _timer is not None and _timer.is_alive():
            return
        _timer = threading.Timer(FLUSH_EVERY_S, flush)
        _timer.daemon = True
        _timer.start()


# What a webhook attempt came to (``webhooks.services.attempt_record``'s status after it).
WEBHOOK_OUTCOMES = {"delivered": "delivered", "pending": "retry", "failed": "failed"}


def webhook_attempt(delivery_status: str) -> None:
    """A webhook delivery's attempt was recorded, the delivery now ``delivery_status``:
    counted as ``delivered`` (a 2xx), ``retry`` (failed, due again after the backoff) or
    ``failed`` (failed for good, the delivery with it)."""
    outcome = WEBHOOK_OUTCOMES.get(delivery_status, delivery_status)
    _add([(WEBHOOK_ATTEMPTS, outcome, 1)])


def webhook_endpoint_disabled(cause: str) -> None:
    """The webhooks service disabled an endpoint by itself: ``gone`` (410), ``failing``
    (failed for long), ``backlog`` (more deliveries pending than WEBHOOK_MAX_BACKLOG)."""
    _add([(WEBHOOK_DISABLED, cause, 1)])


def schedule_fires(kind: str, outcome: str, count: int = 1) -> None:
    """Due times of schedules handled (``kind`` scheduled) or triggers (manual), by
    outcome: ``fired``, the reason one was skipped (``overlap``, ``missed``...), or
    ``error`` (the schedule could not be fired; the tick goes on)."""
    _add([(SCHEDULE_FIRES, f"{kind}{SEP}{outcome}", count)])
