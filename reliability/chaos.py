"""`make chaos`: a mixed workload through the REST API while the stack is broken on purpose.

1. Start throwaway PostgreSQL and Redis, then web (gunicorn), two workers with their own
   hostnames, and beat (``reliability.stack``), with short leases and sweeps so that
   recovery happens within minutes.
2. Submit runs of every shape (``reliability.workload``) from several client threads,
   each POST with its Idempotency-Key and retried on connection errors like a real
   client; cancel some, pause and resume others, approve what waits for approval.
3. Meanwhile inject faults on a seeded random schedule (printed in the report): SIGKILL
   of worker pool children and of whole workers, Redis restarts (one losing its data),
   a PostgreSQL restart, duplicated step and run messages, a second beat, the web server
   killed and restarted.
4. Wait (bounded) until every run is terminal, then check: nothing lost or duplicated,
   every outcome explained, every ledger settled, no step attempt charged twice, no side
   effect executed twice for one attempt, every invariant clean.

The report is a table on stdout and, with ``--json PATH`` (CHAOS_JSON), JSON. The exit
status is 1 when anything is lost or inconsistent. ``--short`` is the version that runs
inside `make test` (tests/integration/test_chaos.py).
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import random
import re
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

import httpx

from reliability.checks import detail_lines, with_descendants
from reliability.client import Client, GaveUp, Tally
from reliability.stack import Stack, wait_for
from reliability.webhooks import WebhookReceiver, pending_deliveries, webhook_report
from reliability.workload import (
    EXPECTED,
    KINDS,
    RATE_LIMIT,
    RUNNER_COMMAND,
    EffectServer,
    plan_for,
)

# Leases, sweeps and lost-message re-sends tuned so that recovery from every fault fits in
# a run of a few minutes. Everything else is the local settings `make run` uses.
CHAOS_SETTINGS = {
    "ENGINE_HEARTBEAT_SECONDS": "1",
    "ENGINE_LEASE_SECONDS": "5",
    "ENGINE_SWEEP_INTERVAL": "2",
    "ENGINE_LOST_MESSAGE_AFTER": "10",
    "HTTP_TOOL_ALLOWED_NETWORKS": "127.0.0.1/32",  # the harness's own effect endpoint
    "API_THROTTLE_RATE": "100000/min",
    "CELERY_WORKER_SEND_TASK_EVENTS": "false",
    # A killed runner's registration goes stale in seconds, not minutes, so that its
    # restart reconnects (and its jobs are recovered) inside the fault window.
    "RUNNER_HEARTBEAT_INTERVAL": "2",
    "RUNNER_STALE_AFTER": "6",
    # Webhooks (reliability/webhooks.py): a receiver failing a third of the time is
    # retried within seconds, and a delivery whose worker was killed is sent again soon.
    "WEBHOOK_BACKOFF": "0.5",
    "WEBHOOK_BACKOFF_MAX": "4",
    "WEBHOOK_TIMEOUT": "5",
    "WEBHOOK_LEASE": "8",
}


@dataclass(frozen=True)
class Workload:
    """What the clients do: shared by `make chaos` and `make chaos-net`."""

    runs: int = 200
    seed: int = 1
    window_s: float = 150.0  # faults are injected during this window
    clients: int = 6
    cancel_share: float = 0.1
    pause_share: float = 0.12
    settle_timeout_s: float = 360.0
    kinds: tuple[str, ...] = KINDS  # the plans' shapes, in turn (reliability.workload)
    # Runs are submitted over about this share of the window (plus what cancels and
    # pauses wait): between two runs a client waits uniform(0, 2 x) the mean that spreads
    # them so. make chaos's runs come over its first 30 %, its faults go on to the end.
    submit_share: float = 0.3


@dataclass(frozen=True)
class Config(Workload):
    child_kills: int = 60
    worker_kills: int = 2
    redis_restarts: int = 2  # the last one loses Redis's data
    postgres_restarts: int = 1
    web_restarts: int = 2
    runner_kills: int = 2
    duplicate_bursts: int = 8
    second_beat: bool = True

    @classmethod
    def short(cls, seed: int) -> Config:
        """About 20 runs, a handful of kills, one Redis restart: fits inside make test."""
        return cls(
            runs=20,
            seed=seed,
            window_s=24.0,
            clients=4,
            child_kills=6,
            worker_kills=0,
            redis_restarts=1,
            postgres_restarts=0,
            web_restarts=0,
            runner_kills=0,
            duplicate_bursts=2,
            second_beat=False,
            settle_timeout_s=150.0,
        )


# --------------------------------------------------------------------------- faults
@dataclass
class Fault:
    at_s: float
    kind: str
    happened_at: float = 0.0  # unix time it was injected
    result: str = ""
    # What was measured around it (make chaos-net: seconds until progress, ...).
    measured: dict[str, float] = field(default_factory=dict)


def fault_schedule(config: Config, rng: random.Random) -> list[Fault]:
    w = config.window_s
    faults = [Fault(rng.uniform(2, w), "kill_worker_child") for _ in range(config.child_kills)]
    faults += [
        Fault(rng.uniform(0.2 * w, 0.8 * w), "kill_worker") for _ in range(config.worker_kills)
    ]
    for i in range(config.redis_restarts):
        lose = i == config.redis_restarts - 1
        slot = (i + 1) / (config.redis_restarts + 1)
        faults.append(
            Fault(w * slot + rng.uniform(-0.05, 0.05) * w,
                  "restart_redis_losing_data" if lose else "restart_redis")
        )  # fmt: skip
    faults += [
        Fault(rng.uniform(0.3 * w, 0.7 * w), "restart_postgres")
        for _ in range(config.postgres_restarts)
    ]
    faults += [
        Fault(rng.uniform(0.1 * w, 0.9 * w), "restart_web") for _ in range(config.web_restarts)
    ]
    faults += [
        Fault(rng.uniform(0.1 * w, w), "duplicate_messages") for _ in range(config.duplicate_bursts)
    ]
    faults += [
        Fault(rng.uniform(0.2 * w, 0.8 * w), "kill_runner") for _ in range(config.runner_kills)
    ]
    if config.second_beat:
        faults += [Fault(0.2 * w, "start_second_beat"), Fault(0.6 * w, "stop_second_beat")]
    return sorted(faults, key=lambda fault: fault.at_s)


def publish_duplicates(run_ids: list[str], rng: random.Random) -> str:
    """Re-publish the execute message of random steps and the pick-up of random runs."""
    from django.db import close_old_connections

    from config.celery import QUEUE_RUNS_NORMAL, QUEUE_STEPS, app
    from orchestrator.transport import EXECUTE_STEP_TASK, PICK_UP_TASK
    from runs.models import Step

    close_old_connections()
    if not run_ids:
        return "no runs yet"
    chosen = rng.sample(run_ids, min(5, len(run_ids)))
    steps = list(Step.objects.filter(run_id__in=chosen).values_list("pk", flat=True)[:40])
    # As the engine publishes them (orchestrator.transport): no result asked for.
    for step_id in steps:
        app.send_task(
            EXECUTE_STEP_TASK, args=(step_id,), queue=QUEUE_STEPS, priority=5, ignore_result=True
        )
    for run_id in chosen:
        app.send_task(
            PICK_UP_TASK, args=(run_id,), queue=QUEUE_RUNS_NORMAL, priority=5, ignore_result=True
        )
    return f"{len(steps)} step and {len(chosen)} run messages"


class Injector(threading.Thread):
    """Injects ``schedule``'s faults at their times (or, when the one before took longer,
    as soon as it is done): one at a time, each reported in its ``result``."""

    def __init__(self, schedule: list[Fault], rng: random.Random, runs: RunBook) -> None:
        super().__init__(name="fault-injector", daemon=True)
        self.schedule, self.rng, self.runs = schedule, rng, runs
        self.started_at = 0.0

    def run(self) -> None:
        self.started_at = time.monotonic()
        for fault in self.schedule:
            delay = fault.at_s - (time.monotonic() - self.started_at)
            if delay > 0:
                time.sleep(delay)  # the schedule itself: faults happen at set times
            fault.happened_at = time.time()
            try:
                fault.result = self.inject(fault)
            except Exception as exc:  # noqa: BLE001 - a fault that could not be injected is reported
                fault.result = f"not injected: {type(exc).__name__}: {exc}"

    def inject(self, fault: Fault) -> str:
        raise NotImplementedError


class StackInjector(Injector):
    """`make chaos`'s faults, on the one-host stack."""

    def __init__(
        self, stack: Stack, schedule: list[Fault], rng: random.Random, runs: RunBook
    ) -> None:
        super().__init__(schedule, rng, runs)
        self.stack = stack

    def inject(self, fault: Fault) -> str:
        stack, kind = self.stack, fault.kind
        if kind == "kill_worker_child":
            return stack.kill_worker_child(self.rng)
        if kind == "kill_worker":
            return stack.kill_worker(self.rng)
        if kind == "restart_redis":
            return stack.restart_redis(lose_data=False)
        if kind == "restart_redis_losing_data":
            return stack.restart_redis(lose_data=True)
        if kind == "restart_postgres":
            return stack.restart_postgres()
        if kind == "restart_web":
            return stack.restart_web()
        if kind == "kill_runner":
            return stack.kill_runner()
        if kind == "duplicate_messages":
            return publish_duplicates(self.runs.ids(), self.rng)
        if kind == "start_second_beat":
            return stack.start_second_beat()
        if kind == "stop_second_beat":
            return stack.stop_second_beat()
        raise ValueError(kind)


# --------------------------------------------------------------------------- workload
@dataclass
class Submitted:
    index: int
    kind: str
    control: str  # "", "cancel", "pause", "resume" (retry reusing) or "fork"
    run_id: str = ""
    cancelled: bool = False
    paused: bool = False
    resumed: bool = False  # retried with reuse: completed
    fork_id: str = ""  # the run forked from it
    error: str = ""


@dataclass
class RunBook:
    lock: threading.Lock = field(default_factory=threading.Lock)
    items: list[Submitted] = field(default_factory=list)

    def add(self, item: Submitted) -> None:
        with self.lock:
            self.items.append(item)

    def ids(self) -> list[str]:
        with self.lock:
            return [item.run_id for item in self.items if item.run_id]


# What is done to a run of these kinds once it has ended (``drive``), unless it is
# cancelled or paused instead.
RESUMED_OR_FORKED = {"fail": "resume", "sequential": "fork"}


def _status_of(response: Any) -> str:
    try:
        return str(response.json().get("status", ""))
    except ValueError:
        return ""


def drive(client: Client, item: Submitted, plan: dict[str, Any], rng: random.Random) -> None:
    """Create and start one run, then cancel or pause/resume it as planned."""
    response = client.request(
        "POST", "/api/v1/runs", json={"plan": plan, "start": True},
        idempotency_key=f"chaos-create-{item.index}",
    )  # fmt: skip
    if response.status_code not in (200, 201):
        item.error = f"create: {response.status_code} {response.text[:200]}"
        return
    item.run_id = response.json()["id"]
    path = f"/api/v1/runs/{item.run_id}"
    if item.control == "cancel":
        time.sleep(rng.uniform(0.2, 3.0))  # a person deciding, at some point mid-flight
        answer = client.request(
            "POST", f"{path}/cancel", json={"reason": "chaos: cancelled by a client"},
            idempotency_key=f"chaos-cancel-{item.index}",
        )  # fmt: skip
        item.cancelled = answer.status_code == 200 and _status_of(answer) == "cancelled"
    elif item.control == "pause":
        time.sleep(rng.uniform(0.2, 2.0))
        for attempt in range(10):
            answer = client.request(
                "POST", f"{path}/pause", idempotency_key=f"chaos-pause-{item.index}-{attempt}"
            )
            if answer.status_code == 200:
                item.paused = True
                break
            current = _status_of(client.request("GET", path))
            if current != "pending":
                break  # finished, or waiting for approval: nothing to pause
            time.sleep(0.5)  # the run was still queued: pause once it runs
        if item.paused:
            time.sleep(rng.uniform(0.5, 3.0))
            answer = client.request(
                "POST", f"{path}/resume", idempotency_key=f"chaos-resume-{item.index}"
            )
            if answer.status_code != 200:
                item.error = f"resume: {answer.status_code} {answer.text[:200]}"
    elif item.control in ("resume", "fork"):
        # Once it has ended: retried reusing what completed (its effects must not run
        # again), or forked from its last effect (what comes before it reused).
        if not _ended(client, path):
            item.error = f"{item.control}: the run did not end within {ENDED_WITHIN_S:g} s"
        elif item.control == "resume":
            answer = client.request(
                "POST", f"{path}/retry", json={"reuse": "completed"},
                idempotency_key=f"chaos-retry-{item.index}",
            )  # fmt: skip
            item.resumed = answer.status_code == 200
            if not item.resumed:
                item.error = f"retry: {answer.status_code} {answer.text[:200]}"
        else:
            answer = client.request(
                "POST", f"{path}/fork", json={"from": FORK_FROM},
                idempotency_key=f"chaos-fork-{item.index}",
            )  # fmt: skip
            if answer.status_code in (200, 201):
                item.fork_id = answer.json()["id"]
            else:
                item.error = f"fork: {answer.status_code} {answer.text[:200]}"


# A run to resume or fork must have ended first; it is polled this long at most.
ENDED_WITHIN_S = 300.0
# Where the `sequential` runs are forked: their last effect (reliability.workload).
FORK_FROM = "agent.seq.e2"
ENDED = ("completed", "failed", "cancelled", "timed_out")


def _ended(client: Client, path: str) -> bool:
    deadline = time.monotonic() + ENDED_WITHIN_S
    while time.monotonic() < deadline:
        if _status_of(client.request("GET", path)) in ENDED:
            return True
        time.sleep(0.5)  # a client polling, not synchronisation
    return False


def approver(client: Client, stop: threading.Event) -> None:
    """Approve whatever waits for approval and resume whatever escalated, as an operator
    on call would (docs/escalation.md): the faults are transient, so carrying on is
    right."""
    while not stop.is_set():
        try:
            page = client.request(
                "GET", "/api/v1/runs", params={"status": "waiting_approval", "page_size": 500}
            )
            for run in page.json().get("results", []):
                client.request("POST", f"/api/v1/runs/{run['id']}/approve", json={"comment": "ok"})
            tickets = client.request(
                "GET", "/api/v1/escalations", params={"status": "open", "page_size": 500}
            )
            for ticket in tickets.json().get("results", []):
                client.request(
                    "POST",
                    f"/api/v1/escalations/{ticket['id']}/resolve",
                    json={"action": "resume", "note": "chaos on-call"},
                    idempotency_key=f"chaos-resolve-{ticket['id']}",
                )
        except (GaveUp, ValueError):
            pass
        stop.wait(1.0)


# --------------------------------------------------------------------------- report
LOG_PROBLEM = re.compile(r"\b(ERROR|CRITICAL)\b|Traceback")


def log_problems(outputs: Iterable[tuple[str, str]]) -> dict[str, Any]:
    """ERROR/CRITICAL lines of (process name, its output), grouped by their gist."""
    gists: Counter[str] = Counter()
    for name, output in outputs:
        for line in output.splitlines():
            if LOG_PROBLEM.search(line):
                gist = re.sub(r"[0-9a-f]{8}-[0-9a-f-]{27}|\d+", "N", line.split("] ", 1)[-1])
                gists[f"{name.split('-')[0]}: {gist[:160]}"] += 1
    return {"lines": sum(gists.values()), "distinct": dict(gists.most_common(15))}


def effect_problems(book: RunBook, effects: Counter[tuple[int, int]]) -> dict[str, Any]:
    """Side effects run twice for one attempt, or for an attempt the database never had."""
    from runs.models import Step

    twice = sorted(f"step {s} attempt {a}: {n} times" for (s, a), n in effects.items() if n > 1)
    attempts = dict(
        Step.objects.filter(pk__in={s for s, _ in effects}).values_list("pk", "attempts")
    )
    phantom = sorted(
        f"step {s} attempt {a} (the database counts {attempts.get(s)})"
        for (s, a) in effects
        if a > attempts.get(s, 0)
    )
    # Steps completed with another step's output (a retry reusing, a fork, a cache hit)
    # ran nothing: their effect is the other step's.
    ran = Step.objects.filter(
        run_id__in=with_descendants(book.ids()), reused_from__isnull=True, cached_from__isnull=True
    )
    borrowed = Step.objects.filter(run_id__in=with_descendants(book.ids())).exclude(
        pk__in=ran.values("pk")
    )
    borrowed_ran = sorted(
        f"step {s} attempt {a}: completed with another step's output, yet its tool ran"
        for s in borrowed.values_list("pk", flat=True)
        for (step, a) in effects
        if step == s
    )
    completed_once = ran.filter(
        tool__in=("http", "runner", "chaos.effect"),
        status="completed",
    ).values_list("pk", "attempts")
    missing = sorted(
        f"step {pk} completed on attempt {n} but its effect was not seen"
        for pk, n in completed_once
        if effects.get((pk, n), 0) == 0
    )
    # The effect endpoint answers with the attempt it saw: a completed step whose
    # recorded answer is another attempt's took a stale worker's outcome (what the
    # attempt number fences out).
    answers = ran.filter(tool="http", status="completed").values_list(
        "pk", "attempts", "output__body__attempt"
    )
    stale = sorted(
        f"step {pk} is on attempt {n} but recorded attempt {seen}'s answer"
        for pk, n, seen in answers
        if seen is not None and int(seen) != n
    )
    # Effects whose attempt lost its lease before it could record (a worker killed or
    # cut off): each ran again under a new attempt, the old outcome never recorded.
    superseded = sum(1 for (s, a) in effects if a < attempts.get(s, 0))
    return {
        "executions": sum(effects.values()),
        "step_attempts": len(effects),
        "executed_twice": twice,
        "phantom_attempts": phantom,
        "completed_without_effect": missing,
        "recorded_from_another_attempt": stale,
        "effects_of_superseded_attempts": superseded,
        "borrowed_steps": borrowed.filter(status="completed").count(),
        "borrowed_steps_that_ran": borrowed_ran,
    }


def sweep_recoveries(book: RunBook) -> dict[str, int]:
    """What the sweeps did: the proof that lost messages and dead workers were recovered."""
    from django.db.models import Sum
    from django.db.models.functions import Coalesce

    from runs.models import HistoryEvent, Run, Step

    runs = book.ids()
    resent = HistoryEvent.objects.filter(
        run_id__in=runs, actor="sweep", message__startswith="re-sent"
    ).values_list("payload", flat=True)
    return {
        "step_messages_resent": sum(len(payload.get("steps", [])) for payload in resent),
        "runs_with_pickup_or_resume_resent": Run.objects.filter(
            pk__in=runs, redispatched_at__isnull=False
        ).count(),
        "step_leases_reclaimed": Step.objects.filter(run_id__in=runs).aggregate(
            n=Coalesce(Sum("reclaims"), 0)
        )["n"],
        "steps_failed_worker_lost": Step.objects.filter(
            run_id__in=runs, error__code="worker_lost"
        ).count(),
    }


def pick_up_latency(book: RunBook) -> dict[str, float]:
    """Seconds from a run's creation (it is started at once) to its pick-up by a worker."""
    from runs.models import Run

    waits = sorted(
        (picked - created).total_seconds()
        for created, picked in Run.objects.filter(
            pk__in=book.ids(), picked_up_at__isnull=False
        ).values_list("created_at", "picked_up_at")
        if picked is not None
    )
    if not waits:
        return {"p50_s": 0.0, "max_s": 0.0, "over_10s": 0}
    return {
        "p50_s": waits[len(waits) // 2],
        "max_s": waits[-1],
        "over_10s": sum(1 for wait in waits if wait > 10),
    }


def policy_summary(book: RunBook) -> str:
    """How often runs escalated (and were resumed by on-call) and were re-planned."""
    from runs.models import EscalationTicket, Replan

    tickets = EscalationTicket.objects.filter(run_id__in=book.ids())
    resumed = tickets.filter(resolution="resume").count()
    spawned = Replan.objects.filter(run_id__in=book.ids(), status="spawned").count()
    return f"{tickets.count()} ({resumed}) / {spawned}"


# The chaos organization's limits: fewer places and slots than the runs and worker
# processes want, so that admission and slots are exercised under faults.
CHAOS_MAX_RUNNING_RUNS = 25
CHAOS_MAX_RUNNING_STEPS = 3


def limit_problems(book: RunBook) -> dict[str, Any]:
    """Runs that waited for a place (with a `queue` event), and any moment when more runs
    than their concurrency key allows, or than the organization allows, ran at once
    (from each run's pick-up to its end)."""
    from runs.models import EventKind, HistoryEvent, Run

    runs = list(
        Run.objects.filter(
            pk__in=book.ids(), parent_run__isnull=True, picked_up_at__isnull=False
        ).values_list("pk", "concurrency_key", "picked_up_at", "status_changed_at", "status")
    )
    waited = (
        HistoryEvent.objects.filter(run_id__in=book.ids(), kind=EventKind.QUEUE)
        .exclude(message="admitted")
        .values("run_id")
        .distinct()
        .count()
    )

    def most_at_once(spans: list[tuple[Any, Any]]) -> int:
        edges = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
        running = most = 0
        for _, step in edges:
            running += step
            most = max(most, running)
        return most

    def span(picked: Any, changed: Any, status: str) -> tuple[Any, Any]:
        ended = status in ("completed", "failed", "cancelled")
        return (picked, changed if ended else datetime.now(UTC))

    by_key: dict[str, list[tuple[Any, Any]]] = {}
    for _, key, picked, changed, status in runs:
        if key:
            by_key.setdefault(key, []).append(span(picked, changed, status))
    over_key = {key: n for key, spans in by_key.items() if (n := most_at_once(spans)) > 1}
    everyone = most_at_once([span(p, c, s) for _, _, p, c, s in runs])
    return {
        "waited": waited,
        "keyed_runs": sum(len(spans) for spans in by_key.values()),
        "keys_over_their_limit": over_key,
        "most_running_at_once": everyone,
        "over_the_organization_limit": max(0, everyone - CHAOS_MAX_RUNNING_RUNS),
    }


# A schedule through the storm (docs/schedules.md): a run every SCHEDULE_EVERY, overlap
# allowed, while faults strike and a second beat runs for part of it (Config.second_beat):
# exactly one run per due time, each ending like any other run.
SCHEDULE_EVERY = "5s"


def create_schedule(client: Client, url: str) -> str:
    plan = {
        "name": "scheduled-in-the-storm",  # not "chaos-": runs_in_database counts those
        "agents": [{"name": "a", "tasks": [{"name": "t", "steps": [
            {"name": "wait", "tool": "sleep", "params": {"seconds": 0.3}},
            {"name": "n", "tool": "noop"},
        ]}]}],
    }  # fmt: skip
    body = {"name": "chaos", "plan": plan, "interval": SCHEDULE_EVERY, "overlap": "allow"}
    answer = client.request("POST", "/api/v1/schedules", json=body)
    client.close()
    if answer.status_code != 201:
        raise RuntimeError(f"could not create the schedule: {answer.status_code} {answer.text}")
    return str(answer.json()["id"])


def pause_schedule(client: Client, schedule_id: str) -> None:
    answer = client.request("POST", f"/api/v1/schedules/{schedule_id}/pause")
    client.close()
    if answer.status_code != 200:
        raise RuntimeError(f"could not pause the schedule: {answer.status_code} {answer.text}")


def schedule_report(schedule_id: str) -> dict[str, Any]:
    """The schedule's due times, from PostgreSQL: each fired once, with its own run."""
    from schedules.models import FireKind, FireStatus, ScheduleFire

    fires = list(
        ScheduleFire.objects.filter(schedule_id=schedule_id, kind=FireKind.SCHEDULED).values_list(
            "due_at", "status", "reason", "run_id"
        )
    )
    fired = [fire for fire in fires if fire[1] == FireStatus.FIRED]
    runs = [str(run) for *_, run in fired if run is not None]
    due = Counter(due_at for due_at, *_ in fires)
    return {
        "every": SCHEDULE_EVERY,
        "due_times": len(due),
        "fired": len(fired),
        "skipped": dict(Counter(reason for _, status, reason, _ in fires if status != "fired")),
        "due_times_fired_twice": sum(1 for n in due.values() if n > 1),
        "fires_without_their_run": len(fired) - len(set(runs)),
        "run_ids": runs,
    }


def declare_rate_limit(client: Client) -> None:
    name, most, period = RATE_LIMIT
    answer = client.request(
        "PUT", f"/api/v1/rate-limits/{name}", json={"limit": most, "period": period}
    )
    if answer.status_code not in (200, 201):
        raise RuntimeError(
            f"could not declare rate limit {name}: {answer.status_code} {answer.text}"
        )
    client.close()


def rate_limit_report() -> dict[str, Any]:
    """The `rate_limited` runs' grants (from PostgreSQL, where the windows are): in any
    window of the period, at most the limit (docs/rate-limits.md), whatever struck."""
    from ratelimits.models import RateGrant
    from runs.plan.durations import read_duration_ms

    name, most, period = RATE_LIMIT
    window = timedelta(milliseconds=read_duration_ms(period))
    grants: dict[str, list[tuple[datetime, int]]] = {}
    for bucket, at, units in RateGrant.objects.filter(
        bucket__contains=f":{name}:", used=True
    ).values_list("bucket", "granted_at", "units"):
        grants.setdefault(bucket, []).append((at, units))
    heaviest = 0
    for rows in grants.values():
        rows.sort()
        end, inside = 0, 0
        for start in range(len(rows)):
            while end < len(rows) and rows[end][0] < rows[start][0] + window:
                inside += rows[end][1]
                end += 1
            heaviest = max(heaviest, inside)
            inside -= rows[start][1]
    return {
        "limit": f"{most} per {period}",
        "grants": sum(len(rows) for rows in grants.values()),
        "buckets": len(grants),
        "heaviest_window": heaviest,
        "windows_over_the_limit": heaviest > most,
    }


def outcome_problems(book: RunBook) -> list[str]:
    """Runs whose final status no fault or action explains."""
    from runs.models import Run

    forks = [item.fork_id for item in book.items if item.fork_id]
    found = {
        str(pk): (status, last_error or {})
        for pk, status, last_error in Run.objects.filter(pk__in=book.ids() + forks).values_list(
            "pk", "status", "last_error"
        )
    }
    problems = []
    runs = [(item, item.run_id) for item in book.items if item.run_id]
    runs += [(item, item.fork_id) for item in book.items if item.fork_id]
    for item, run_id in runs:
        status, error = found.get(run_id, ("missing", {}))
        expected = {EXPECTED[item.kind]}  # a fork ends as its source would have
        if item.cancelled and run_id == item.run_id:
            expected = {"cancelled"}
        elif item.control == "cancel":
            expected.add("cancelled")  # the cancel may have landed after a retry, or not
        # A step whose worker was killed at every try ends worker_lost (by design).
        if status == "failed" and error.get("code") == "worker_lost":
            expected.add("failed")
        # The same, in a child run its sync step waited for.
        if error.get("code") == "child_failed" and "worker_lost" in error.get("message", ""):
            expected.add("failed")
        if status not in expected:
            problems.append(
                f"{run_id} ({item.kind}{', ' + item.control if item.control else ''}): "
                f"{status}, expected {' or '.join(sorted(expected))}; last_error {error}"
            )
    return problems


def format_report(report: dict[str, Any], title: str = "chaos") -> str:
    lines = ["", f"{title}: seed {report['seed']}, {report['runs_requested']} runs", ""]
    lines.append("| check | result |")
    lines.append("|---|---|")
    consistency = report["consistency"]
    effects = report["side_effects"]
    recovery = (
        f"{report['recovery_s']:.1f} s"
        if report["recovery_s"] >= 0
        else "every run had ended before the last fault"
    )
    pickup = report["pick_up_latency"]
    pickups = f"{pickup['p50_s']:.2f} s / {pickup['max_s']:.2f} s ({pickup['over_10s']} over 10 s)"
    by_status = ", ".join(f"{k} {v}" for k, v in consistency["runs_by_status"].items())
    executed = f"{effects['executions']} for {effects['step_attempts']} step attempts"
    rows = [
        ("runs by final status (child runs included)", by_status),
        ("runs created / requested", f"{report['runs_created']} / {report['runs_requested']}"),
        ("runs in the database (duplicates or losses show here)", report["runs_in_database"]),
        ("child runs their `run` steps started", report["child_runs"]),
        ("escalations (resolved by on-call) / re-plans spawned", report["policy"]),
        ("runs that waited for a place / most running at once (limit)", (
            f"{report['limits']['waited']} / {report['limits']['most_running_at_once']} "
            f"({CHAOS_MAX_RUNNING_RUNS})"
        )),
        ("keyed runs / keys over their limit (1)", (
            f"{report['limits']['keyed_runs']} / {len(report['limits']['keys_over_their_limit'])}"
        )),
        ("scheduled due times: fired / skipped / fired twice", (
            f"{report['schedule']['fired']} / {sum(report['schedule']['skipped'].values())} "
            f"{report['schedule']['skipped'] or ''} / {report['schedule']['due_times_fired_twice']}"
        )),
        ("rate-limited grants / heaviest window (limit)", (
            f"{report['rate_limit']['grants']} / {report['rate_limit']['heaviest_window']} "
            f"({report['rate_limit']['limit']})"
        )),
        ("webhooks: terminal runs not told / deliveries lost / bad signatures", (
            f"{len(report['webhooks']['terminal_runs_not_told'])} of "
            f"{report['webhooks']['terminal_runs']} / "
            f"{len(report['webhooks']['deliveries_lost'])} of {report['webhooks']['deliveries']} / "
            f"{report['webhooks']['bad_signatures']} ({report['webhooks']['requests']} requests, "
            f"{report['webhooks']['answered_500_on_purpose']} answered 500 on purpose)"
        )),
        ("faults injected", ", ".join(f"{k} {v}" for k, v in report["faults_by_kind"].items())),
        ("side effects executed", executed),
        ("side effects executed twice for one attempt", len(effects["executed_twice"])),
        ("side effects for attempts the database never had", len(effects["phantom_attempts"])),
        ("completed effect steps, effect unseen", len(effects["completed_without_effect"])),
        ("effect steps that recorded another attempt's answer (fencing)",
         len(effects["recorded_from_another_attempt"])),
        ("effects of attempts superseded after a lost lease (run again)",
         effects["effects_of_superseded_attempts"]),
        ("runs resumed reusing / forked; steps completed with another's output (tool ran)", (
            f"{report['resumed']} / {report['forked']}; {effects['borrowed_steps']} "
            f"({len(effects['borrowed_steps_that_ran'])})"
        )),
        ("step attempts charged twice", len(consistency["step_attempts_charged_twice"])),
        ("runs whose ledger does not settle", len(consistency["ledgers_unsettled"])),
        ("check_invariants", "clean" if consistency["invariants"]["clean"] else "VIOLATED"),
        ("runs stuck (not terminal)", len(consistency["runs_stuck"])),
        ("outcomes no fault explains", len(report["unexplained_outcomes"])),
        ("API answers 5xx (not 502-504)", len(report["api"]["server_errors"])),
        ("API connection errors retried", report["api"]["connection_errors"]),
        ("last fault -> last run terminal", recovery),
        ("pick-up latency p50 / max", pickups),
        ("recovered by the sweeps", ", ".join(
            f"{k.replace('_', ' ')} {v}" for k, v in report["recovered_by_sweeps"].items()
        )),
        ("processes that exited by themselves (restarted)", len(report["unexpected_exits"])),
        ("worker/beat log error lines", report["worker_log_errors"]["lines"]),
        ("verdict", "PASS" if report["ok"] else "FAIL"),
    ]  # fmt: skip
    lines += [f"| {name} | {value} |" for name, value in rows]
    lines += ["", "fault schedule (seconds after the first submission):"]
    lines += [f"  {f['at_s']:7.2f}  {f['kind']:<26} {f['result']}" for f in report["faults"]]
    lines += detail_lines(
        [
            ("unexplained outcomes", report["unexplained_outcomes"]),
            ("stuck runs", consistency["runs_stuck"]),
            ("unsettled ledgers", consistency["ledgers_unsettled"]),
            ("charged twice", consistency["step_attempts_charged_twice"]),
            ("effects twice", effects["executed_twice"]),
            ("phantom effects", effects["phantom_attempts"]),
            ("effects missing", effects["completed_without_effect"]),
            ("outcomes recorded from another attempt", effects["recorded_from_another_attempt"]),
            ("borrowed steps whose tool ran", effects["borrowed_steps_that_ran"]),
            ("API 5xx", report["api"]["server_errors"]),
            ("processes that exited by themselves", report["unexpected_exits"]),
            ("submission errors", report["submission_errors"]),
            ("runs whose end no webhook told", report["webhooks"]["terminal_runs_not_told"]),
            ("webhook deliveries lost", report["webhooks"]["deliveries_lost"]),
        ],
        consistency["invariants"]["violations"],
        report["worker_log_errors"]["distinct"],
        "worker/beat log errors (most frequent; faults cause some by design)",
    )
    return "\n".join(lines)


# --------------------------------------------------------------------------- main
def run_chaos(config: Config, directory: Path, log: Any = print) -> dict[str, Any]:
    rng = random.Random(config.seed)
    stack = Stack(directory, settings_env=dict(CHAOS_SETTINGS))
    effects = EffectServer()
    try:
        log(f"==> servers in {directory}")
        stack.start_servers()
        os.environ.update(stack.env)
        import django

        django.setup()
        stack.migrate()
        org = json.loads(stack.manage("create_org", f"chaos-{config.seed}", "--credits", "1000000"))
        # Limits that bind (docs/fairness.md): runs wait for a place and steps for a slot
        # while the faults strike; the report checks none was lost or exceeded.
        stack.manage(
            "set_limits",
            f"chaos-{config.seed}",
            "--max-running-runs",
            str(CHAOS_MAX_RUNNING_RUNS),
            "--max-running-steps",
            str(CHAOS_MAX_RUNNING_STEPS),
        )
        log("==> web, 2 workers, beat, a runner")
        stack.start_processes()
        script = directory / "runner_job.py"
        script.write_text(RUNNER_COMMAND)
        stack.start_runner(org["api_key"], script, effects.url)
        stack.start_worker(org["api_key"], effects.url)
        wait_for_worker(stack, org["api_key"])
        report = storm(
            config,
            rng,
            StackTarget(stack),
            effects,
            org["api_key"],
            lambda book, draw: StackInjector(stack, fault_schedule(config, draw), draw, book),
            log,
        )
        report["directory"] = str(directory)
        return report
    finally:
        effects.close()
        stack.close()


class Target(Protocol):
    """What the storm needs of the system under test (one host, or `make chaos-net`'s
    cluster)."""

    @property
    def base_urls(self) -> list[str]:
        """The web hosts' URLs: clients spread over them and fail over between them."""
        ...

    @property
    def unexpected_exits(self) -> list[str]: ...

    def supervise(self, stop: threading.Event) -> None:
        """Restart what exits by itself, remembering it, until ``stop``."""

    def outputs(self) -> Iterable[tuple[str, str]]:
        """(process name, its log) of the workers and beats, for ``log_problems``."""
        ...


@dataclass
class StackTarget:
    stack: Stack

    @property
    def base_urls(self) -> list[str]:
        return [self.stack.base_url]

    @property
    def unexpected_exits(self) -> list[str]:
        return self.stack.unexpected_exits

    def supervise(self, stop: threading.Event) -> None:
        self.stack.supervise(stop)

    def outputs(self) -> Iterable[tuple[str, str]]:
        return ((n, p.output()) for n, p in self.stack.processes.items() if n != "web")


def wait_for_worker(stack: Stack, api_key: str) -> None:
    """Until the `orch worker` has registered: its tool is in the organization's
    catalogue, which the worker_tool runs' plans are checked against."""

    def online() -> bool:
        try:
            answer = httpx.get(
                f"{stack.base_url}/api/v1/tools/chaos.effect",
                headers={"Authorization": f"Bearer {api_key}"},
                timeout=5,
            )
        except httpx.TransportError:
            return False  # a web still starting on a loaded machine: asked again
        return answer.status_code == 200 and bool(answer.json()["offered_by"])

    wait_for(online, 60, "the orch worker to register")


def storm(
    config: Workload,
    rng: random.Random,
    target: Target,
    effects: EffectServer,
    key: str,
    injector_for: Callable[[RunBook, random.Random], Injector],
    log: Any,
) -> dict[str, Any]:
    """Submit ``config``'s runs through ``target``'s web hosts while ``injector_for``'s
    faults strike, wait for every run to end, and check everything (the report)."""
    from django.db import OperationalError, close_old_connections

    from reliability.checks import check_runs, non_terminal
    from runs.models import Run

    tally = Tally()
    book = RunBook()
    work: queue.Queue[tuple[Submitted, dict[str, Any], random.Random]] = queue.Queue()
    for index in range(config.runs):
        kind = config.kinds[index % len(config.kinds)]
        draw = rng.random()
        control = (
            "cancel"
            if draw < config.cancel_share
            else "pause"
            if draw < config.cancel_share + config.pause_share
            else ""
        )
        if not control and kind in RESUMED_OR_FORKED:
            control = RESUMED_OR_FORKED[kind]
        item = Submitted(index, kind, control)
        book.add(item)
        work.put((item, plan_for(kind, index, effects.url, rng), random.Random(rng.random())))
    injector = injector_for(book, random.Random(rng.random()))
    schedule = injector.schedule
    submit_span = config.window_s * config.submit_share
    pace = 2 * submit_span * config.clients / max(config.runs, 1)

    urls = target.base_urls

    def client_loop(n: int) -> None:
        # Each client starts on a web host of its own and fails over to the next.
        client = Client(urls[n % len(urls)], key, tally, fallbacks=urls)
        try:
            while True:
                try:
                    item, plan, item_rng = work.get_nowait()
                except queue.Empty:
                    return
                try:
                    drive(client, item, plan, item_rng)
                except GaveUp as exc:
                    item.error = str(exc)
                except Exception:  # noqa: BLE001 - reported, never silently lost
                    item.error = traceback.format_exc(limit=3)
                time.sleep(item_rng.uniform(0, pace))  # spread submissions over the window
        finally:
            client.close()

    if "rate_limited" in config.kinds:
        declare_rate_limit(Client(urls[0], key, tally, fallbacks=urls))
    # Every run's end is told to a webhook receiver that fails a third of the time.
    hooks = WebhookReceiver(effects.host, seed=rng.randrange(2**32))
    hooks.register(Client(urls[0], key, tally, fallbacks=urls))
    schedule_id = create_schedule(Client(urls[0], key, tally, fallbacks=urls), effects.url)
    log(f"==> {config.runs} runs from {config.clients} clients; {len(schedule)} faults over "
        f"{config.window_s:g}s (seed {config.seed})")  # fmt: skip
    stop_approving = threading.Event()
    approval_client = Client(urls[0], key, tally, fallbacks=urls)
    approving = threading.Thread(
        target=approver, args=(approval_client, stop_approving), daemon=True
    )
    clients = [
        threading.Thread(target=client_loop, args=(n,), daemon=True) for n in range(config.clients)
    ]
    stop_supervising = threading.Event()
    supervisor = threading.Thread(target=target.supervise, args=(stop_supervising,), daemon=True)
    supervisor.start()
    started = time.time()
    injector.start()
    approving.start()
    for thread in clients:
        thread.start()
    for thread in clients:
        thread.join()
    # No new scheduled run once the clients are done: the schedule's runs share the
    # organization's slots with the storm's, and must end like the rest.
    pause_schedule(Client(urls[0], key, tally, fallbacks=urls), schedule_id)
    injector.join()
    log(f"==> faults done after {time.time() - started:.0f}s; waiting for every run to end")

    def settled() -> bool:
        try:
            close_old_connections()
            return not non_terminal(book.ids() + schedule_report(schedule_id)["run_ids"])
        except OperationalError:
            return False

    try:
        wait_for(settled, config.settle_timeout_s, "every run to reach a terminal state")
    except TimeoutError as exc:
        log(f"!! {exc}")

    def told() -> bool:
        try:
            close_old_connections()
            return pending_deliveries() == 0
        except OperationalError:
            return False

    try:
        # Once the runs are terminal, what is left is retries seconds apart.
        wait_for(told, min(120.0, config.settle_timeout_s), "every webhook delivery to be sent")
    except TimeoutError as exc:
        log(f"!! {exc}")
    stop_approving.set()
    approving.join(10)
    stop_supervising.set()
    supervisor.join(10)
    approval_client.close()

    close_old_connections()
    scheduled = schedule_report(schedule_id)
    webhooks = webhook_report(hooks)
    hooks.close()
    consistency = check_runs(book.ids() + scheduled["run_ids"])
    last_fault = max((f.happened_at for f in schedule), default=started)
    last_end = (
        Run.objects.filter(pk__in=book.ids())
        .order_by("-status_changed_at")
        .values_list("status_changed_at", flat=True)
        .first()
    )
    recovery = (last_end.timestamp() - last_fault) if last_end else 0.0
    effect_report = effect_problems(book, effects.log.snapshot())
    unexplained = outcome_problems(book)
    # The runs submitted: child runs (started by `run` steps) are counted apart.
    org_runs = Run.objects.filter(
        name__startswith="chaos-", parent_run__isnull=True, forked_from_run__isnull=True
    ).count()
    child_runs = Run.objects.filter(name__startswith="chaos-", parent_run__isnull=False).count()
    created = len(book.ids())
    report: dict[str, Any] = {
        "seed": config.seed,
        "config": asdict(config),
        "started_at": datetime.fromtimestamp(started, UTC).isoformat(),
        "runs_requested": config.runs,
        "runs_created": created,
        "runs_in_database": org_runs,
        "child_runs": child_runs,
        "policy": policy_summary(book),
        "limits": limit_problems(book),
        "rate_limit": rate_limit_report(),
        "schedule": {k: v for k, v in scheduled.items() if k != "run_ids"},
        "webhooks": webhooks,
        "submission_errors": [f"#{i.index} {i.kind}: {i.error}" for i in book.items if i.error],
        "controls": dict(Counter(i.control or "none" for i in book.items)),
        "resumed": sum(1 for i in book.items if i.resumed),
        "forked": sum(1 for i in book.items if i.fork_id),
        "faults": [asdict(f) for f in schedule],
        "faults_by_kind": dict(Counter(f.kind for f in schedule if not f.result.startswith("not"))),
        "consistency": consistency.as_dict(),
        "side_effects": effect_report,
        "unexplained_outcomes": unexplained,
        "api": {
            "statuses": {str(k): v for k, v in sorted(tally.statuses.items())},
            "connection_errors": tally.connection_errors,
            "retries": tally.retries,
            "server_errors": tally.server_errors,
        },
        "recovery_s": recovery,
        "pick_up_latency": pick_up_latency(book),
        "recovered_by_sweeps": sweep_recoveries(book),
        "worker_log_errors": log_problems(target.outputs()),
        "unexpected_exits": list(target.unexpected_exits),
    }
    report["ok"] = bool(
        consistency.ok
        and created == config.runs
        and org_runs == config.runs
        and not report["submission_errors"]
        and not unexplained
        and not effect_report["executed_twice"]
        and not effect_report["phantom_attempts"]
        and not effect_report["completed_without_effect"]
        and not effect_report["recorded_from_another_attempt"]
        and not effect_report["borrowed_steps_that_ran"]
        and not tally.server_errors
        and not target.unexpected_exits
        and not report["limits"]["keys_over_their_limit"]
        and not report["limits"]["over_the_organization_limit"]
        and not report["rate_limit"]["windows_over_the_limit"]
        and not scheduled["due_times_fired_twice"]
        and not scheduled["fires_without_their_run"]
        and scheduled["fired"] > 0
        and webhooks["ok"]
    )
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m reliability.chaos", description=(__doc__ or "").split("\n")[0]
    )
    parser.add_argument("--seed", type=int, default=int(os.environ.get("CHAOS_SEED") or 1))
    parser.add_argument("--runs", type=int, default=int(os.environ.get("CHAOS_RUNS") or 200))
    parser.add_argument("--short", action="store_true", help="the make-test version: ~20 runs")
    parser.add_argument("--json", default=os.environ.get("CHAOS_JSON", ""))
    parser.add_argument("--keep", action="store_true", help="keep the directory (logs, data)")
    args = parser.parse_args(argv)
    config = Config.short(args.seed) if args.short else Config(runs=args.runs, seed=args.seed)
    directory = Path(tempfile.mkdtemp(prefix="orchestrator-chaos."))
    report = run_chaos(config, directory, log=lambda text: print(text, file=sys.stderr, flush=True))
    print(format_report(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2, default=str))
    if not args.keep and report["ok"]:
        import shutil

        shutil.rmtree(directory, ignore_errors=True)
    else:
        print(f"\nlogs and data kept in {directory}", file=sys.stderr)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
