"""`GET /metrics` (docs/operations.md, Metrics), only to `Authorization: Bearer <METRICS_TOKEN>` (no
token configured: 404): what processes counted in Redis (``common.metrics``), what the
database holds and the broker's queue depths, read at each scrape by a custom collector
(never prometheus_client's process-global registry)."""

from __future__ import annotations

import hmac
import logging
import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from typing import Any

import redis
from django.conf import settings
from django.db import connection
from django.http import HttpRequest, HttpResponse, HttpResponseNotFound
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from common import eventstreams, metrics
from config.celery import ALL_QUEUES, queue_keys

logger = logging.getLogger(__name__)
# The hashes processes count in, in the order the scrape reads them.
_COUNTED = (metrics.STEPS, metrics.DURATION, metrics.QUEUE_WAIT, metrics.SWEEPS, metrics.API,
            metrics.DOORBELLS, metrics.RATE_LIMITS, metrics.RATE_LIMIT_WAIT,
            metrics.WEBHOOK_ATTEMPTS, metrics.SCHEDULE_FIRES, metrics.WEBHOOK_DISABLED)  # fmt: skip


def metrics_view(request: HttpRequest) -> HttpResponse:
    token = str(settings.METRICS_TOKEN or "")
    if not token:
        return HttpResponseNotFound()
    sent = request.headers.get("Authorization", "")
    if not hmac.compare_digest(sent.encode(), f"Bearer {token}".encode()):
        response = HttpResponse("unauthorized\n", status=401, content_type="text/plain")
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    metrics.flush()  # what this process summed (its API requests) goes out first
    registry = CollectorRegistry(auto_describe=False)
    registry.register(OrchestratorCollector())
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)


def _fields(raw: dict[bytes, bytes]) -> Iterator[tuple[list[str], str]]:
    for field, value in raw.items():
        yield field.decode().split(metrics.SEP), value.decode()


def _histogram(name: str, help_text: str, raw: dict[bytes, bytes], label: str = "tool") -> Metric:
    family = HistogramMetricFamily(name, help_text, labels=[label])
    per_tool: dict[str, dict[str, float]] = defaultdict(dict)
    for parts, value in _fields(raw):
        per_tool[parts[0]][parts[1]] = float(value)
    for tool, values in sorted(per_tool.items()):
        cumulative = 0.0
        buckets = []
        for index, bound in enumerate((*metrics.BUCKETS, float("inf"))):
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
            timers = GaugeMetricFamily(
                "orchestrator_timer_waiting_steps", "Wait steps parked on their timers now."
            )
            timed = 0
            for reason, count in cursor.fetchall():
                if reason == "timer":
                    timed = count
                else:
                    waiting.add_metric([reason.removeprefix("rate_limited:")], count)
            timers.add_metric([], timed)
        yield from (runs, entries, credits, waiting, timers)

    def _redis(self) -> Iterator[Metric]:
        client = metrics.connection()
        try:
            pipe = client.pipeline(transaction=False)
            for key in _COUNTED:
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
        webhook_attempts, schedule_fires, webhook_disabled = results[8 : len(_COUNTED)]
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
        attempts_made = CounterMetricFamily(
            "orchestrator_webhook_attempts",
            "Webhook delivery attempts by outcome: delivered (a 2xx answer), retry (failed, "
            "due again after the backoff), failed (failed for good, the delivery with it).",
            labels=["outcome"],
        )
        for parts, value in _fields(webhook_attempts):
            attempts_made.add_metric(parts[:1], float(value))
        fires = CounterMetricFamily(
            "orchestrator_schedule_fires",
            "Schedules' due times (kind scheduled) and triggers (manual) by outcome: fired, "
            "the reason one was skipped (overlap, missed, insufficient_credits...), or error.",
            labels=["kind", "outcome"],
        )
        for parts, value in _fields(schedule_fires):
            fires.add_metric(parts[:2], float(value))
        disabled = CounterMetricFamily(
            "orchestrator_webhook_endpoints_disabled",
            "Webhook endpoints the service disabled, by cause: gone (it answered 410), "
            "failing (failed for long), backlog (more deliveries pending than "
            "WEBHOOK_MAX_BACKLOG).",
            labels=["cause"],
        )
        for parts, value in _fields(webhook_disabled):
            disabled.add_metric(parts[:1], float(value))
        yield from (attempts_made, fires, disabled)
        depth = GaugeMetricFamily(
            "orchestrator_queue_depth", "Messages waiting in each Celery queue.", labels=["queue"]
        )
        for queue, waiting in queue_depths_in(results[len(_COUNTED) : -1]).items():
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
