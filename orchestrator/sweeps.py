"""Periodic sweeps (scheduled by django-celery-beat, see orchestrator.schedules).

Each sweep is idempotent and batched: it selects a bounded batch of candidate rows,
then handles each run under that run's lock and re-checks every row before acting, so a
second beat, a late tick or two workers sweeping at once do no harm.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from orchestrator import engine
from orchestrator.dispatch import Outbox, StepMessage
from runs.models import Step
from runs.states import RunStatus, StepStatus
from runs.transitions import transition


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
            run = engine.lock_run(run_id)
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
                    engine.step_failed(run, step, engine.Failure("worker_lost", message), outbox)
                    counts["failed"] += 1
    return counts


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
        outbox.add(StepMessage(pending.pk, run.priority, engine.step_timeout_s(pending)))
    elif run.status == RunStatus.PAUSED:
        transition(Step, pending.pk, StepStatus.PAUSED, message="run is paused")
