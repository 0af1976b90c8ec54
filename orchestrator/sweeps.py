"""Periodic sweeps (scheduled by django-celery-beat, see orchestrator.periodic).

Each sweep is idempotent and batched: it selects a bounded batch of candidate rows,
then handles each run under that run's lock and re-checks every row before acting, so a
second beat, a late tick or two workers sweeping at once do no harm.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import F, Min, Q
from django.db.models.functions import Greatest
from django.utils import timezone

from runs import services
from runs.admission import run_admission
from runs.engine.failure import Failure, node_timed_out
from runs.engine.outcomes import step_failed
from runs.models import Agent, EventKind, Run, Step, Task
from runs.outbox import Outbox, RunMessage, StepMessage, enqueue_run_message
from runs.people import escalations
from runs.plan import format_duration_ms
from runs.states import RunStatus, StepStatus
from runs.transitions import record_event, transition


def reclaim_expired_leases() -> dict[str, int]:
    """Steps whose worker stopped renewing their lease: run them again, at most
    ENGINE_MAX_RECLAIMS times, then fail them with `worker_lost`."""
    now = timezone.now()
    rows = Step.objects.filter(status=StepStatus.RUNNING, lease_expires_at__lt=now).values_list(
        "pk", "run_id"
    )[: settings.ENGINE_SWEEP_BATCH]
    by_run: dict[Any, list[int]] = defaultdict(list)
    for step_id, run_id in rows:
        by_run[run_id].append(step_id)
    counts = {"reclaimed": 0, "failed": 0}
    for run_id, step_ids in by_run.items():
        with transaction.atomic():
            run = services.lock_run(run_id, light=True)
            outbox = Outbox()
            expired = Step.objects.select_for_update(no_key=True).filter(
                pk__in=step_ids, status=StepStatus.RUNNING, lease_expires_at__lt=now
            )
            for step in expired:
                if step.reclaims < settings.ENGINE_MAX_RECLAIMS:
                    _reclaim(run, step, outbox)
                    counts["reclaimed"] += 1
                else:
                    message = f"worker lost: lease expired {step.reclaims + 1} times"
                    error = {"code": "worker_lost", "message": message, "retryable": False}
                    Step.objects.filter(pk=step.pk).update(
                        error=error, failures=F("failures") + 1, lease_expires_at=None
                    )
                    step.error = error
                    step_failed(run, step, Failure("worker_lost", message), outbox)
                    counts["failed"] += 1
    return counts


def leases_next_due() -> datetime | None:
    """When the first running step's lease expires: when beat sends the lease sweep."""
    rows = Step.objects.filter(status=StepStatus.RUNNING, lease_expires_at__isnull=False)
    return rows.order_by("lease_expires_at").values_list("lease_expires_at", flat=True).first()


def _reclaim(run: Any, step: Step, outbox: Outbox) -> None:
    pending = transition(
        Step,
        step.pk,
        StepStatus.PENDING,
        message=f"lease expired on {step.worker or 'unknown worker'}; reclaimed",
        payload={"reclaims": step.reclaims + 1},
        updates={"reclaims": step.reclaims + 1, "lease_expires_at": None, "next_run_at": None},
    ).obj
    if run.status == RunStatus.RUNNING:
        outbox.add(StepMessage(pending.pk, str(run.pk), run.priority, pending.timeout_s))
    elif run.status == RunStatus.PAUSED:
        transition(Step, pending.pk, StepStatus.PAUSED, message="run is paused")


# --------------------------------------------------------------------------- timeouts
# Run-level timed states: (status, timeouts key, clock column, what happens). A plan's
# `timeouts` has no `created` (runs.plan.Timeouts): CREATED_RUN_TTL is the server's.
_RUN_TIMEOUTS = (
    (RunStatus.CREATED, "created", "status_changed_at", "cancel"),
    (RunStatus.PENDING, "pending", "status_changed_at", "fail"),
    (RunStatus.RESUMING, "resuming", "status_changed_at", "fail"),
    (RunStatus.RETRYING, "retrying", "status_changed_at", "fail"),
    (RunStatus.PAUSED, "paused", "status_changed_at", "cancel"),
    (RunStatus.RUNNING, "run", "picked_up_at", "fail"),
    (RunStatus.WAITING_APPROVAL, "run", "picked_up_at", "fail"),
    (RunStatus.ESCALATED, "run", "picked_up_at", "fail"),
    (RunStatus.ESCALATED, "escalated", "status_changed_at", "fail"),
)
# The last_error code of each timeout, where it is not "<key>_timeout".
_TIMEOUT_CODES = {"escalated": "escalation_timeout"}

# The moment a run in a timed state is past its deadline: its own `timeouts`
# (milliseconds) or the default, from the state's clock column.
_RUN_DEADLINE = """{clock} + make_interval(
        secs => COALESCE((timeouts ->> %(key)s)::bigint, %(default_ms)s) / 1000.0)"""
_TIMED_RUNS = "FROM runs_run WHERE status = %(status)s AND {clock} IS NOT NULL"
_OVERDUE_RUNS_SQL = f"""
SELECT id {_TIMED_RUNS} AND {_RUN_DEADLINE} < %(now)s ORDER BY {{clock}} LIMIT %(limit)s
"""

# Agents and tasks running in a run that can time them out (_time_out_node).
_NODE_DEADLINE = """n.started_at + make_interval(
        secs => COALESCE(n.timeout_ms, %(default_ms)s) / 1000.0)"""
_TIMED_NODES = """FROM {table} AS n JOIN runs_run AS r ON r.id = n.run_id
WHERE n.status = 'running' AND r.status IN ('running', 'waiting_approval')"""
_OVERDUE_NODES_SQL = f"""
SELECT n.id, n.run_id {_TIMED_NODES} AND {_NODE_DEADLINE} < %(now)s
ORDER BY n.started_at LIMIT %(limit)s
"""
_NODE_TIMEOUTS = ((Agent, "runs_agent", "agent"), (Task, "runs_task", "task"))


def _timeout_ms(key: str) -> int:
    return int(settings.RUN_TIMEOUT_DEFAULTS[key]) * 1000


def timeouts_next_due() -> datetime | None:
    """The earliest deadline ``sweep_timeouts`` acts on: when beat sends it next."""
    deadlines = []
    with connection.cursor() as cursor:
        for status, key, clock, _ in _RUN_TIMEOUTS:
            sql = f"SELECT min({_RUN_DEADLINE}) {_TIMED_RUNS}".format(clock=clock)
            cursor.execute(sql, {"status": status, "key": key, "default_ms": _timeout_ms(key)})
            deadlines.append(cursor.fetchone()[0])
        for _, table, key in _NODE_TIMEOUTS:
            sql = f"SELECT min({_NODE_DEADLINE}) {_TIMED_NODES}".format(table=table)
            cursor.execute(sql, {"default_ms": _timeout_ms(key)})
            deadlines.append(cursor.fetchone()[0])
    return min((deadline for deadline in deadlines if deadline is not None), default=None)


def sweep_timeouts(now: datetime | None = None) -> dict[str, int]:
    """End every run, agent and task that stayed too long in a timed state.

    pending, resuming, retrying and running (the run timeout) end FAILED, paused and
    created (never started: CREATED_RUN_TTL) end CANCELLED, each with a `last_error`
    naming the timeout; an agent or task past its timeout fails and its parent reacts by
    its failure mode. Each row is re-checked under its run's lock, so a run that moved on
    meanwhile (a created run started) is left alone.
    """
    now = now or timezone.now()
    counts: dict[str, int] = defaultdict(int)
    for status, key, clock, action in _RUN_TIMEOUTS:
        with connection.cursor() as cursor:
            cursor.execute(
                _OVERDUE_RUNS_SQL.format(clock=clock),
                {
                    "status": status,
                    "key": key,
                    "default_ms": _timeout_ms(key),
                    "now": now,
                    "limit": settings.ENGINE_SWEEP_BATCH,
                },
            )
            run_ids = [row[0] for row in cursor.fetchall()]
        for run_id in run_ids:
            if _time_out_run(run_id, status, key, action, now):
                counts[_TIMEOUT_CODES.get(key, f"{key}_timeout")] += 1
    for model, table, key in _NODE_TIMEOUTS:
        with connection.cursor() as cursor:
            cursor.execute(
                _OVERDUE_NODES_SQL.format(table=table),
                {"default_ms": _timeout_ms(key), "now": now, "limit": settings.ENGINE_SWEEP_BATCH},
            )
            rows = cursor.fetchall()
        for node_id, run_id in rows:
            if _time_out_node(model, node_id, run_id, key, now):
                counts[f"{key}_timeout"] += 1
    return dict(counts)


def _limit_ms(run: Run, key: str) -> int:
    value = (run.timeouts or {}).get(key)
    return int(value) if value else int(settings.RUN_TIMEOUT_DEFAULTS[key]) * 1000


def _time_out_run(run_id: Any, status: str, key: str, action: str, now: datetime) -> bool:
    with transaction.atomic():
        run = services.lock_run(run_id, light=True)
        clock = run.picked_up_at if key == "run" else run.status_changed_at
        limit = _limit_ms(run, key)
        if run.status != status or clock is None or (now - clock).total_seconds() * 1000 < limit:
            return False  # it moved on, or its deadline moved, since the batch was read
        code = _TIMEOUT_CODES.get(key, f"{key}_timeout")
        message = f"{code.replace('_', ' ')}: {status} for more than {format_duration_ms(limit)}"
        if action == "cancel":
            services.run_cancel(run_id=run.pk, reason=message, actor="sweep", error_code=code)
        else:
            services.run_fail(run_id=run.pk, code=code, message=message, actor="sweep")
        return True


def _time_out_node(model: Any, node_id: int, run_id: Any, key: str, now: datetime) -> bool:
    with transaction.atomic():
        run = services.lock_run(run_id, light=True)
        node = model.objects.filter(pk=node_id, status="running").first()
        if node is None or run.status not in (RunStatus.RUNNING, RunStatus.WAITING_APPROVAL):
            return False
        limit = node.timeout_ms or int(settings.RUN_TIMEOUT_DEFAULTS[key]) * 1000
        if node.started_at is None or (now - node.started_at).total_seconds() * 1000 < limit:
            return False
        message = f"{key} {node.name} timed out after {format_duration_ms(limit)}"
        node_timed_out(run, node, f"{key}_timeout", message)
        return True


# --------------------------------------------------------------------------- lost messages
def redispatch_lost(now: datetime | None = None, older_than: float | None = None) -> dict[str, int]:
    """Send again the work whose broker message was lost.

    - a step dispatched, pending and due for longer than ENGINE_LOST_MESSAGE_AFTER
      without being claimed (Redis lost it, or a consumer dropped it);
    - a run PENDING or RETRYING that long (its pick-up message), RESUMING (its resume).

    A message that was only slow becomes a duplicate, which the claim turns into a no-op.
    """
    now = now or timezone.now()
    threshold = now - timedelta(
        seconds=older_than if older_than is not None else settings.ENGINE_LOST_MESSAGE_AFTER
    )
    counts = {"steps": 0, "runs": 0}
    lost = (
        Step.objects.filter(
            status=StepStatus.PENDING,
            dispatched_at__lt=threshold,
            run__status=RunStatus.RUNNING,
        )
        .filter(Q(next_run_at__isnull=True) | Q(next_run_at__lt=threshold))
        .values_list("pk", "run_id")[: settings.ENGINE_SWEEP_BATCH]
    )
    by_run: dict[Any, list[int]] = defaultdict(list)
    for step_id, run_id in lost:
        by_run[run_id].append(step_id)
    for run_id, step_ids in by_run.items():
        with transaction.atomic():
            run = services.lock_run(run_id, light=True)
            if run.status != RunStatus.RUNNING:
                continue
            outbox = Outbox()
            steps = list(
                Step.objects.select_for_update(no_key=True).filter(
                    pk__in=step_ids, status=StepStatus.PENDING, dispatched_at__lt=threshold
                )
            )
            # A fresh dispatch time: the next sweep waits a full threshold again. Sent now,
            # a step asleep (its wake sweep late) is awake: the wake sweep sends it no more.
            sent = Step.objects.filter(pk__in=[s.pk for s in steps])
            sent.update(dispatched_at=now, asleep=False)
            for step in steps:
                outbox.add(StepMessage(step.pk, str(run.pk), run.priority, step.timeout_s))
            if steps:
                record_event(
                    run,
                    EventKind.OPERATOR,
                    actor="sweep",
                    message=f"re-sent {len(steps)} step message(s) presumed lost",
                    payload={"steps": [s.pk for s in steps]},
                )
            counts["steps"] += len(steps)
    # At most once per threshold per run: a run merely queued behind a backlog must not
    # collect a duplicate message on every pass.
    stalled = (
        Run.objects.filter(
            status__in=[RunStatus.PENDING, RunStatus.RETRYING, RunStatus.RESUMING],
            status_changed_at__lt=threshold,
        )
        .filter(Q(redispatched_at__isnull=True) | Q(redispatched_at__lt=threshold))
        .values_list("pk", "status", "priority")[: settings.ENGINE_SWEEP_BATCH]
    )
    for run_id, status, priority in stalled:
        message = RunMessage.RESUME if status == RunStatus.RESUMING else RunMessage.PICK_UP
        with transaction.atomic():
            Run.objects.filter(pk=run_id).update(redispatched_at=now)
            enqueue_run_message(message, run_id, priority)
        counts["runs"] += 1
    counts.update(_redispatch_policy(now, threshold))
    return counts


def lost_messages_next_due() -> datetime | None:
    """The earliest moment ``redispatch_lost`` finds something to send again: each rule's
    clock (GREATEST skips a NULL) plus ENGINE_LOST_MESSAGE_AFTER; now while runs wait for a
    place (looked at on every pass). A ticket's clock is its opening, earlier than the
    rule's (its last notice): a lower bound, sooner than needed, never later."""
    if run_admission.organizations_waiting(1):
        return timezone.now()
    clocks = [
        Step.objects.filter(
            status=StepStatus.PENDING, dispatched_at__isnull=False, run__status=RunStatus.RUNNING
        ).aggregate(at=Min(Greatest("dispatched_at", "next_run_at")))["at"],
        Run.objects.filter(
            status__in=[RunStatus.PENDING, RunStatus.RETRYING, RunStatus.RESUMING]
        ).aggregate(at=Min(Greatest("status_changed_at", "redispatched_at")))["at"],
        Run.objects.filter(replan_pending_since__isnull=False).aggregate(
            at=Min(Greatest("replan_pending_since", "redispatched_at"))
        )["at"],
        escalations.first_unnotified(),
    ]
    after = timedelta(seconds=settings.ENGINE_LOST_MESSAGE_AFTER)
    return min((clock + after for clock in clocks if clock is not None), default=None)


def _redispatch_policy(now: datetime, threshold: datetime) -> dict[str, int]:
    """Re-plans not answered and escalation notices not sent within the threshold: their
    messages were lost (a re-plan answers once, a notice is sent once per channel, so a
    duplicate does no harm); and runs waiting for a place that may have one now."""
    counts = {"replans": 0, "notices": 0, "admissions": 0}
    # Runs waiting for a place: a run that ended while another was being queued may not
    # have seen it (runs.admission.run_admission); they are looked at again on every pass.
    for organization_id in run_admission.organizations_waiting(settings.ENGINE_SWEEP_BATCH):
        counts["admissions"] += len(run_admission.admit_waiting(organization_id))
    waiting = (
        Run.objects.filter(replan_pending_since__lt=threshold)
        .filter(Q(redispatched_at__isnull=True) | Q(redispatched_at__lt=threshold))
        .values_list("pk", "priority")[: settings.ENGINE_SWEEP_BATCH]
    )
    for run_id, priority in waiting:
        with transaction.atomic():
            Run.objects.filter(pk=run_id).update(redispatched_at=now)
            enqueue_run_message(RunMessage.REPLAN, run_id, priority)
        counts["replans"] += 1
    older_than = timedelta(seconds=settings.ENGINE_LOST_MESSAGE_AFTER)
    for run_id in escalations.overdue_notices(older_than, settings.ENGINE_SWEEP_BATCH):
        priority = Run.objects.values_list("priority", flat=True).get(pk=run_id)
        with transaction.atomic():
            enqueue_run_message(RunMessage.ESCALATED, run_id, priority)
        counts["notices"] += 1
    return counts
