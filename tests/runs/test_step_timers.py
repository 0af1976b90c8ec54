"""A wait step's timer in PostgreSQL, without a worker (runs.admission.step_admission.timer): the
claim never lets it through before its time, the claim at its time counts the wait
apart, and an attempt claimed again after its worker was lost does not wait anew."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from orchestrator import executor
from orchestrator.sweeps import reclaim_expired_leases
from runs import services
from runs.admission import step_admission
from runs.engine import control
from runs.engine.start import run_start
from runs.models import Run, Step
from runs.transitions import claim_step
from tests import factories

pytestmark = pytest.mark.django_db(transaction=True)

HOUR_MS = 3_600_000


def parked_wait() -> Step:
    plan = factories.plan(steps=0) | {
        "agents": [{"name": "a", "tasks": [{"name": "t", "steps": [
            {"name": "w", "tool": "wait", "params": {"for": "1h"}},
        ]}]}]
    }  # fmt: skip
    run = services.run_create(organization=factories.org(credits=100), plan=plan)
    run_start(run_id=run.pk)
    control.pick_up(run.pk)  # begun at its start already, or now
    step = Step.objects.get(run=run)
    assert claim(step) is not None
    admission = timer(step, attempt=1)
    assert admission.until is not None
    assert admission.reason == step_admission.TIMER
    return Step.objects.get(pk=step.pk)


def claim(step: Step) -> dict[str, Any] | None:
    return claim_step(step.pk, worker="w", task_id="t", lease_seconds=60)


def timer(step: Step, attempt: int) -> step_admission.Admission:
    return step_admission.timer(
        step_id=step.pk, run_id=step.run_id, attempt=attempt, until=None, for_ms=HOUR_MS
    )


def test_a_parked_wait_holds_nothing_and_no_claim_takes_it_before_its_time() -> None:
    step = parked_wait()

    assert (step.status, step.waiting_reason, step.attempts) == ("pending", "timer", 0)
    assert step.next_run_at is not None
    assert step.next_run_at - timezone.now() > timedelta(minutes=59)
    assert (step.lease_expires_at, step.worker) == (None, "")
    assert claim(step) is None  # never early
    # A message that comes ahead of it (a countdown fired early) sends the next, and
    # takes no slot.
    assert executor.execute_step(step.pk, worker="w", task_id="t") == "early"


def test_the_claim_at_its_time_counts_the_wait_apart_and_a_lost_worker_does_not_restart_it() -> (
    None
):
    step = parked_wait()
    # Its hour has passed.
    Step.objects.filter(pk=step.pk).update(
        next_run_at=timezone.now(), status_changed_at=timezone.now() - timedelta(hours=1)
    )

    assert claim(step) is not None
    woken = Step.objects.get(pk=step.pk)
    assert woken.waited_ms >= HOUR_MS
    assert woken.started_at is not None
    assert timezone.now() - woken.started_at < timedelta(minutes=1)
    # Its worker is lost before the step is recorded: the lease sweep takes it back.
    Step.objects.filter(pk=step.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    assert reclaim_expired_leases()["reclaimed"] == 1

    again = claim(step)
    assert again is not None
    assert timer(step, attempt=again["attempts"]).go  # it has waited: not another hour
    assert Step.objects.get(pk=step.pk).waiting_reason == ""


def test_a_run_that_ends_drops_its_timers() -> None:
    step = parked_wait()

    services.run_cancel(run_id=step.run_id, reason="no more waiting")

    ended = Step.objects.get(pk=step.pk)
    assert (ended.status, ended.waiting_reason, ended.next_run_at) == ("cancelled", "", None)
    assert Run.objects.get(pk=step.run_id).status == "cancelled"
