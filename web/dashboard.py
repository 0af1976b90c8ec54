"""The operators' dashboard: `/admin/dashboard/` (docs/dashboard.md).

One selector per panel, each returning plain typed data, then the view that renders
them into ``admin/dashboard.html``. The page is server-rendered HTML and SVG with inline
CSS: it works on a host without internet access.

Every query is bounded, so the page stays fast whatever the tables hold: by a time
window over an index that exists, or by a LIMIT. No table here has an index on time
alone, so the windowed figures start from the runs that can have anything in the window,
found on ``run_status_changed`` (status, status_changed_at): every run in a live status,
and the runs whose status changed within the window (a terminal run's last change is its
end, and nothing happens in a run after its end). From those runs, the steps
(``step_run_status``) and failed attempts (``stepfailure_run_time``) in the window.

The broker's figures (queue depths, workers) come from Redis and Celery's remote
control. A broker that is down makes those panels say so; the page still renders. Asking
the workers costs up to ``INSPECT_TIMEOUT_S``, so their answer is kept for
``WORKERS_CACHE_S`` in each web process.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import quote

import redis
from django.conf import settings
from django.contrib import admin
from django.db import connection
from django.db.models import Case, Count, Min, Value, When
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from kombu import Connection

from common import metrics
from config.celery import app
from runs.models import (
    NO_WORKER_OFFERS_TOOL,
    EscalationStatus,
    EscalationTicket,
    Run,
    Runner,
    RunnerJob,
    RunnerJobStatus,
    Step,
)
from runs.states import RUN_TERMINAL, RunStatus, StepStatus
from runs.waits.runners import is_online
from web import prometheus

RUNS_WINDOW = timedelta(hours=24)
FAILURES_WINDOW = timedelta(hours=24)
THROUGHPUT_MINUTES = 60
TOP_FAILURE_CODES = 10
ESCALATIONS_SHOWN = 20
RUNNERS_SHOWN = 50
# Celery's inspect waits this long for every worker's answer (it cannot know how many
# there are); stats and active are asked at the same time, so a page pays it once.
INSPECT_TIMEOUT_S = 0.5
WORKERS_CACHE_S = 10.0

# A run in one of these can do work whenever it was last changed; any other status is
# counted, and searched for work, only when it was reached within the window.
LIVE = [s.value for s in RunStatus if s not in RUN_TERMINAL and s != RunStatus.CREATED]
WINDOWED = [s.value for s in RunStatus if s in RUN_TERMINAL or s == RunStatus.CREATED]
ENDED = [s.value for s in RunStatus if s in RUN_TERMINAL]
HELD = [RunnerJobStatus.CLAIMED, RunnerJobStatus.RUNNING, RunnerJobStatus.STOPPING]

# The runs that may have had a step finish or fail since %(since)s (the two halves are
# disjoint). The queries below join them LATERALly, each subquery fenced by OFFSET 0 so
# that it is not flattened into a join: each run's rows are then read on its own index
# whatever the planner thinks of the tables' sizes. Flattened, it picked a hash join over
# a sequential scan of every step ever run: right for a small table, ruinous for a
# large one.
_CANDIDATES = """
    SELECT id FROM runs_run WHERE status = ANY(%(live)s)
    UNION ALL
    SELECT id FROM runs_run WHERE status = ANY(%(ended)s) AND status_changed_at >= %(since)s
"""


def _window_params(since: datetime) -> dict[str, Any]:
    return {"live": LIVE, "ended": ENDED, "since": since}


# --------------------------------------------------------------------------- runs
@dataclass(frozen=True)
class StatusCount:
    status: str
    count: int
    live: bool  # counted whenever it got there (a live status), not only within the window


@dataclass(frozen=True)
class RunsByStatus:
    since: datetime
    statuses: list[StatusCount]

    @property
    def total(self) -> int:
        return sum(row.count for row in self.statuses)


def runs_by_status(now: datetime | None = None) -> RunsByStatus:
    """Every run alive at some point in the last 24 h, by its status now: the runs in a
    live status, and those that reached a terminal status (or were created) within the
    window. One index range per status on ``run_status_changed``, index-only."""
    now = now or timezone.now()
    since = now - RUNS_WINDOW
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT status, count(*) FROM runs_run WHERE status = ANY(%(live)s) GROUP BY status
            UNION ALL
            SELECT status, count(*) FROM runs_run
            WHERE status = ANY(%(windowed)s) AND status_changed_at >= %(since)s
            GROUP BY status
            """,
            {"live": LIVE, "windowed": WINDOWED, "since": since},
        )
        counts: dict[str, int] = dict(cursor.fetchall())
    return RunsByStatus(
        since=since,
        statuses=[StatusCount(s.value, counts.get(s.value, 0), s.value in LIVE) for s in RunStatus],
    )


# --------------------------------------------------------------------------- throughput
@dataclass(frozen=True)
class MinuteCount:
    minute: datetime  # the minute's start
    completed: int  # steps that completed in that minute (their successful attempt)
    failed: int  # step attempts that failed in that minute

    @property
    def total(self) -> int:
        return self.completed + self.failed


def steps_per_minute(now: datetime | None = None) -> list[MinuteCount]:
    """Step attempts finished in each of the last 60 minutes (the current one included,
    so far), oldest first: steps completed (``Step.completed_at``) and failed attempts
    (``StepFailure``), of the runs that can have any."""
    now = now or timezone.now()
    current = now.replace(second=0, microsecond=0)
    since = current - timedelta(minutes=THROUGHPUT_MINUTES - 1)
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            WITH candidates AS MATERIALIZED ({_CANDIDATES})
            SELECT date_trunc('minute', done.at), count(*), 0
            FROM candidates CROSS JOIN LATERAL (
                SELECT completed_at AS at FROM runs_step
                WHERE run_id = candidates.id
                  AND status = %(completed)s AND completed_at >= %(since)s
                OFFSET 0
            ) AS done
            GROUP BY 1
            UNION ALL
            SELECT date_trunc('minute', failed.at), 0, count(*)
            FROM candidates CROSS JOIN LATERAL (
                SELECT created_at AS at FROM runs_stepfailure
                WHERE run_id = candidates.id AND created_at >= %(since)s
                OFFSET 0
            ) AS failed
            GROUP BY 1
            """,  # noqa: S608 - a constant of this module, no input
            {**_window_params(since), "completed": StepStatus.COMPLETED.value},
        )
        rows = cursor.fetchall()
    completed: dict[datetime, int] = {}
    failed: dict[datetime, int] = {}
    for minute, done, failures in rows:
        completed[minute] = completed.get(minute, 0) + done
        failed[minute] = failed.get(minute, 0) + failures
    minutes = [since + timedelta(minutes=n) for n in range(THROUGHPUT_MINUTES)]
    return [MinuteCount(m, completed.get(m, 0), failed.get(m, 0)) for m in minutes]


# --------------------------------------------------------------------------- failures
@dataclass(frozen=True)
class FailureCode:
    code: str
    attempts: int
    runs: int
    last_at: datetime


@dataclass(frozen=True)
class TopFailures:
    since: datetime
    codes: list[FailureCode]
    total: int  # failed attempts in the window, every code


def top_failure_codes(now: datetime | None = None) -> TopFailures:
    """The error codes of the step attempts that failed in the last 24 h, most frequent
    first (at most ``TOP_FAILURE_CODES``), with the runs they hit and when last seen."""
    now = now or timezone.now()
    since = now - FAILURES_WINDOW
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            WITH candidates AS MATERIALIZED ({_CANDIDATES}),
            failures AS (
                SELECT code, count(*) AS attempts, count(DISTINCT candidates.id) AS runs,
                       max(at) AS last_at
                FROM candidates CROSS JOIN LATERAL (
                    SELECT code, created_at AS at FROM runs_stepfailure
                    WHERE run_id = candidates.id AND created_at >= %(since)s
                    OFFSET 0
                ) AS failed
                GROUP BY code
            )
            SELECT code, attempts, runs, last_at, sum(attempts) OVER () FROM failures
            ORDER BY attempts DESC, code LIMIT %(limit)s
            """,  # noqa: S608 - a constant of this module, no input
            {**_window_params(since), "limit": TOP_FAILURE_CODES},
        )
        rows = cursor.fetchall()
    return TopFailures(
        since=since,
        codes=[FailureCode(code, n, runs, last) for code, n, runs, last, _ in rows],
        total=int(rows[0][4]) if rows else 0,
    )


# --------------------------------------------------------------------------- the broker
@dataclass(frozen=True)
class QueueDepth:
    queue: str
    depth: int


@dataclass(frozen=True)
class Queues:
    reachable: bool
    error: str
    queues: list[QueueDepth]
    unacked: int  # messages delivered to a worker and not yet acknowledged, every queue


def queue_depths() -> Queues:
    """Messages waiting in each Celery queue, read from the broker's lists (one per
    priority step: ``config.celery.queue_keys``), one pipelined round trip."""
    options: dict[str, Any] = settings.CELERY_BROKER_TRANSPORT_OPTIONS
    try:
        with metrics.new_client() as client:
            pipe = client.pipeline(transaction=False)
            prometheus.ask_queue_depths(pipe)
            pipe.hlen(options.get("unacked_key", "unacked"))
            results: list[int] = pipe.execute()
    except (redis.RedisError, OSError) as exc:
        return Queues(False, f"{type(exc).__name__}: {exc}", [], 0)
    depths = prometheus.queue_depths_in(results[:-1])
    return Queues(True, "", [QueueDepth(q, n) for q, n in depths.items()], results[-1])


@dataclass(frozen=True)
class Worker:
    name: str
    concurrency: int | None  # the pool's processes
    active: int  # tasks it is running
    processed: int  # tasks it has received since it started
    uptime_s: int | None
    pid: int | None
    flower_url: str

    @property
    def uptime(self) -> str:
        return _duration(self.uptime_s) if self.uptime_s is not None else ""


def _duration(seconds: int) -> str:
    """The two largest units: 3 d 4 h, 2 h 0 min, 7 min 5 s, 40 s."""
    parts: list[str] = []
    rest = int(seconds)
    for size, unit in ((86400, "d"), (3600, "h"), (60, "min"), (1, "s")):
        count, rest = divmod(rest, size)
        if count or parts:
            parts.append(f"{count} {unit}")
    return " ".join(parts[:2]) or "0 s"


@dataclass(frozen=True)
class Workers:
    reachable: bool
    error: str
    workers: list[Worker]
    flower_url: str


_workers_lock = threading.Lock()
_workers_cache: dict[str, tuple[float, Workers]] = {}


def forget_workers() -> None:
    """Drop the cached answers (tests)."""
    with _workers_lock:
        _workers_cache.clear()


def workers_online(*, timeout: float | None = None) -> Workers:
    """The workers that answered Celery's inspect (stats and active, asked at once),
    cached for ``WORKERS_CACHE_S`` per broker URL. A broker that cannot be reached is
    reported at once (no connection retries), not waited for."""
    url: str = settings.CELERY_BROKER_URL
    with _workers_lock:
        cached = _workers_cache.get(url)
    if cached is not None and time.monotonic() - cached[0] < WORKERS_CACHE_S:
        return cached[1]
    answer = _ask_workers(url, INSPECT_TIMEOUT_S if timeout is None else timeout)
    with _workers_lock:
        _workers_cache[url] = (time.monotonic(), answer)
    return answer


@contextmanager
def _broker(url: str) -> Iterator[Connection]:
    # One second to connect, not the transport's five: the page waits for it. Replies
    # are read by BRPOP, whose timeout (the polling interval) both rounds the wait up
    # and is waited out again when the connection closes: 20 ms, not 1 s (fractions of
    # a second need Redis 6 or newer).
    options = {"socket_connect_timeout": 1, "polling_interval": 0.02}
    with app.connection_for_read(url, transport_options=options) as conn:
        conn.ensure_connection(max_retries=0)
        yield conn


def _inspect(url: str, timeout: float, method: str) -> dict[str, Any]:
    with _broker(url) as conn:
        answer = getattr(app.control.inspect(timeout=timeout, connection=conn), method)()
    return dict(answer or {})


def _ask_workers(url: str, timeout: float) -> Workers:
    flower = settings.DASHBOARD_FLOWER_URL
    try:
        with ThreadPoolExecutor(max_workers=2) as pool:
            asked = {m: pool.submit(_inspect, url, timeout, m) for m in ("stats", "active")}
            stats, active = asked["stats"].result(), asked["active"].result()
    except Exception as exc:  # noqa: BLE001 - whatever the broker did, the page renders
        return Workers(False, f"{type(exc).__name__}: {exc}", [], flower)
    rows = [_worker(n, stats.get(n), active.get(n), flower) for n in sorted({*stats, *active})]
    return Workers(True, "", rows, flower)


def _worker(name: str, stats: Mapping[str, Any] | None, active: Any, flower: str) -> Worker:
    stats = stats or {}
    pool = stats.get("pool") or {}
    totals = stats.get("total") or {}
    return Worker(
        name=name,
        concurrency=pool.get("max-concurrency"),
        active=len(active or []),
        processed=sum(int(n) for n in totals.values()),
        uptime_s=stats.get("uptime"),
        pid=stats.get("pid"),
        flower_url=f"{flower.rstrip('/')}/worker/{quote(name, safe='@')}" if flower else "",
    )


# --------------------------------------------------------------------------- runners
@dataclass(frozen=True)
class RunnerRow:
    id: str
    organization: str
    hostname: str
    project_dir: str
    executor_type: str
    tags: list[str]
    online: bool
    last_heartbeat: datetime
    jobs_held: int
    admin_url: str


@dataclass(frozen=True)
class Runners:
    registered: int  # not deregistered, online or stale
    online: int
    jobs_waiting: int  # jobs no runner has claimed yet
    runners: list[RunnerRow]  # the most recently heard from, at most RUNNERS_SHOWN


def runners_online(now: datetime | None = None) -> Runners:
    """The registered runners (docs/runners.md), online first: one silent for
    RUNNER_STALE_AFTER is stale. Empty when no runner is registered."""
    now = now or timezone.now()
    stale_before = now - timedelta(seconds=settings.RUNNER_STALE_AFTER)
    registered = Runner.objects.filter(deregistered_at__isnull=True)
    rows = list(
        registered.select_related("organization").order_by("-last_heartbeat", "id")[:RUNNERS_SHOWN]
    )
    if not rows:
        return Runners(0, 0, 0, [])
    held: dict[str, int] = {}
    for runner_id in RunnerJob.objects.filter(
        runner_id__in=[r.pk for r in rows], status__in=HELD
    ).values_list("runner_id", flat=True):
        held[runner_id] = held.get(runner_id, 0) + 1
    return Runners(
        registered=registered.count(),
        online=registered.filter(last_heartbeat__gte=stale_before).count(),
        jobs_waiting=RunnerJob.objects.filter(status=RunnerJobStatus.PENDING).count(),
        runners=[
            RunnerRow(
                id=r.pk,
                organization=r.organization.name,
                hostname=r.hostname,
                project_dir=r.project_dir,
                executor_type=r.executor_type,
                tags=list(r.tags or []),
                online=is_online(r, now),
                last_heartbeat=r.last_heartbeat,
                jobs_held=held.get(r.pk, 0),
                admin_url=reverse("admin:runs_runner_change", args=[r.pk]),
            )
            for r in rows
        ],
    )


# --------------------------------------------------------------------------- pending
@dataclass(frozen=True)
class PendingRun:
    id: str
    name: str
    organization: str
    priority: int
    pending_since: datetime
    age: timedelta
    queued_reason: str
    admin_url: str


@dataclass(frozen=True)
class Pending:
    count: int
    oldest: PendingRun | None


def oldest_pending_run(now: datetime | None = None) -> Pending:
    """The run PENDING the longest (since its last change of status), and how many
    are: the front of ``run_status_changed`` for status pending."""
    now = now or timezone.now()
    pending = Run.objects.filter(status=RunStatus.PENDING)
    run = (
        pending.select_related("organization")
        .only("name", "priority", "status_changed_at", "queued_reason", "organization__name")
        .order_by("status_changed_at", "pk")
        .first()
    )
    if run is None:
        return Pending(0, None)
    return Pending(
        count=pending.count(),
        oldest=PendingRun(
            id=str(run.pk),
            name=run.name,
            organization=run.organization.name,
            priority=run.priority,
            pending_since=run.status_changed_at,
            age=now - run.status_changed_at,
            queued_reason=run.queued_reason,
            admin_url=reverse("admin:runs_run_change", args=[run.pk]),
        ),
    )


# --------------------------------------------------------------------------- rate limits
@dataclass(frozen=True)
class RateWait:
    limit: str  # the limit's name ("tool:<tool>" for a global one)
    steps: int
    next_at: datetime | None  # the soonest of their reserved moments


@dataclass(frozen=True)
class ToolWait:
    tool: str
    steps: int


def worker_tool_waits() -> list[ToolWait]:
    """Steps of worker tools that no online worker offers (docs/tools.md, "Waiting for
    a worker"), by tool: parked RUNNING with waiting_reason no_worker_offers_tool."""
    rows = (
        Step.objects.filter(status=StepStatus.RUNNING, waiting_reason=NO_WORKER_OFFERS_TOOL)
        .values("tool")
        .annotate(steps=Count("pk"))
        .order_by("-steps", "tool")
    )
    return [ToolWait(row["tool"], row["steps"]) for row in rows]


def rate_limit_waits() -> list[RateWait]:
    """Steps waiting for rate limits' units now, by limit (docs/rate-limits.md): the
    partial index step_rate_waiting holds exactly these rows."""
    rows = (
        Step.objects.filter(status=StepStatus.PENDING)
        .exclude(waiting_reason="")
        .exclude(waiting_reason="timer")  # a wait step's own timer: no limit's line
        .values("waiting_reason")
        .annotate(steps=Count("pk"), next_at=Min("next_run_at"))
        .order_by("-steps", "waiting_reason")
    )
    return [
        RateWait(row["waiting_reason"].removeprefix("rate_limited:"), row["steps"], row["next_at"])
        for row in rows
    ]


# --------------------------------------------------------------------------- escalations
SEVERITY_ORDER = {"critical": 0, "high": 1, "medium": 2, "low": 3}


@dataclass(frozen=True)
class Escalation:
    id: str
    run_id: str
    run_name: str
    organization: str
    reason: str
    severity: str
    status: str
    opened_at: datetime
    age: timedelta
    admin_url: str
    run_admin_url: str


@dataclass(frozen=True)
class Escalations:
    count: int
    tickets: list[Escalation]  # the most severe, then the oldest, at most ESCALATIONS_SHOWN


def open_escalations(now: datetime | None = None) -> Escalations:
    """Tickets not resolved (open or acknowledged): found on the partial index that
    keeps one such ticket per run (``escalation_one_open_per_run``)."""
    now = now or timezone.now()
    unresolved = EscalationTicket.objects.exclude(status=EscalationStatus.RESOLVED)
    count = unresolved.count()
    if not count:
        return Escalations(0, [])
    by_severity = Case(
        *(When(severity=severity, then=Value(rank)) for severity, rank in SEVERITY_ORDER.items()),
        default=Value(len(SEVERITY_ORDER)),
    )
    tickets = (
        unresolved.select_related("run", "organization")
        .only("reason", "severity", "status", "opened_at", "run__name", "organization__name")
        .order_by(by_severity, "opened_at", "pk")[:ESCALATIONS_SHOWN]
    )
    return Escalations(
        count=count,
        tickets=[
            Escalation(
                id=str(t.pk),
                run_id=str(t.run_id),
                run_name=t.run.name,
                organization=t.organization.name,
                reason=t.reason,
                severity=t.severity,
                status=t.status,
                opened_at=t.opened_at,
                age=now - t.opened_at,
                admin_url=reverse("admin:runs_escalationticket_change", args=[t.pk]),
                run_admin_url=reverse("admin:runs_run_change", args=[t.run_id]),
            )
            for t in tickets
        ],
    )


# --------------------------------------------------------------------------- the page
CHART_WIDTH = 600
CHART_HEIGHT = 180
CHART_TOP = 12  # room above the tallest bar


@dataclass(frozen=True)
class Bar:
    """One minute of the steps-per-minute chart, in SVG coordinates."""

    minute: MinuteCount
    x: float
    width: float
    completed_y: float
    completed_height: float
    failed_y: float
    failed_height: float


@dataclass(frozen=True)
class Chart:
    width: int
    height: int
    bars: list[Bar]
    peak: int
    total_completed: int
    total_failed: int
    gridlines: list[tuple[float, int]]  # (y, value)

    @property
    def per_minute(self) -> float:
        return round((self.total_completed + self.total_failed) / max(len(self.bars), 1), 1)


def throughput_chart(minutes: list[MinuteCount]) -> Chart:
    """Bars of completed (below) and failed (above) attempts per minute, scaled to the
    busiest minute."""
    peak = max((m.total for m in minutes), default=0)
    scale = (CHART_HEIGHT - CHART_TOP) / peak if peak else 0.0
    slot = CHART_WIDTH / max(len(minutes), 1)
    bars = []
    for index, minute in enumerate(minutes):
        completed_h = minute.completed * scale
        failed_h = minute.failed * scale
        bars.append(
            Bar(
                minute=minute,
                x=round(index * slot + 1, 2),
                width=round(slot - 2, 2),
                completed_y=round(CHART_HEIGHT - completed_h, 2),
                completed_height=round(completed_h, 2),
                failed_y=round(CHART_HEIGHT - completed_h - failed_h, 2),
                failed_height=round(failed_h, 2),
            )
        )
    gridlines = [
        (round(CHART_HEIGHT - value * scale, 2), value)
        for value in sorted({peak, peak // 2})
        if value > 0
    ]
    return Chart(
        width=CHART_WIDTH,
        height=CHART_HEIGHT,
        bars=bars,
        peak=peak,
        total_completed=sum(m.completed for m in minutes),
        total_failed=sum(m.failed for m in minutes),
        gridlines=gridlines,
    )


@dataclass(frozen=True)
class StatusBar:
    status: StatusCount
    percent: float  # of the busiest status, for the bar's width


def status_bars(runs: RunsByStatus) -> list[StatusBar]:
    peak = max((row.count for row in runs.statuses), default=0)
    return [
        StatusBar(row, round(100 * row.count / peak, 1) if peak else 0.0) for row in runs.statuses
    ]


@dataclass(frozen=True)
class Dashboard:
    now: datetime
    runs: RunsByStatus
    status_bars: list[StatusBar]
    throughput: Chart
    failures: TopFailures
    queues: Queues
    workers: Workers
    runners: Runners
    pending: Pending
    escalations: Escalations
    rate_waits: list[RateWait]
    tool_waits: list[ToolWait]


def dashboard(now: datetime | None = None) -> Dashboard:
    now = now or timezone.now()
    runs = runs_by_status(now)
    return Dashboard(
        now=now,
        runs=runs,
        status_bars=status_bars(runs),
        throughput=throughput_chart(steps_per_minute(now)),
        failures=top_failure_codes(now),
        queues=queue_depths(),
        workers=workers_online(),
        runners=runners_online(now),
        pending=oldest_pending_run(now),
        escalations=open_escalations(now),
        rate_waits=rate_limit_waits(),
        tool_waits=worker_tool_waits(),
    )


def dashboard_view(request: HttpRequest) -> HttpResponse:
    """The page; staff only (``admin.site.admin_view`` in config/urls.py)."""
    context = {
        **admin.site.each_context(request),
        "title": "Dashboard",
        "dashboard": dashboard(),
        "inspect_timeout_s": INSPECT_TIMEOUT_S,
        "workers_cache_s": int(WORKERS_CACHE_S),
    }
    return TemplateResponse(request, "admin/dashboard.html", context)
