"""Control that needs the engine: picking a run up, and resuming it after a pause."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from billing.models import Organization
from common import logcontext, tracing
from runs import services
from runs.admission import run_admission
from runs.engine.dispatch import dispatch, update_waiting_state
from runs.engine.failure import held_failure, run_failed
from runs.engine.policy import escalation_held
from runs.engine.propagation import finish_if_done
from runs.engine.start import begin
from runs.models import Agent, Run, Step, Task
from runs.outbox import Outbox, StepMessage
from runs.plan import PlanInvalid
from runs.states import NodeStatus, RunStatus, StepStatus
from runs.transitions import transition_many


def pick_up(run_id: Any, actor: str = "worker") -> bool:
    """(RETRYING ->) PENDING -> RUNNING: materialise the plan and dispatch what is ready.

    A stored plan that no longer validates (the validator grew stricter since the run
    was created) fails the run with `invalid_plan` rather than leaving it pending. A run
    its organization's limits do not admit yet stays PENDING with its `queued_reason`
    (``runs.admission.run_admission``), and is picked up when a place frees.
    """
    if not tracing.enabled:
        return _pick_up(run_id, actor)
    stored = Run.objects.filter(pk=run_id).values_list("trace_context", flat=True).first()
    attributes = {"orchestrator.run.id": str(run_id)}
    # An untraced run (no stored context) gets the no-op span.
    with tracing.span("run pick_up", parent_context=stored or "", attributes=attributes) as span:
        picked = _pick_up(run_id, actor)
        span.set_attribute("orchestrator.picked_up", picked)
        return picked


def _pick_up(run_id: Any, actor: str) -> bool:
    if not run_admission.admit(run_id, actor=actor):
        return False
    with transaction.atomic():
        run = services.lock_run(run_id)
        logcontext.add(organization_id=run.organization_id)  # for the task's log lines
        if run.status == RunStatus.RETRYING:
            run = services.run_requeue(run_id=run_id, actor=actor)
        if run.status != RunStatus.PENDING:
            return False  # a duplicate delivery, or cancelled while queued
        try:
            plan = services.plan_of(run)
        except PlanInvalid as exc:
            # Nothing is written yet: no savepoint is needed to fail the run instead.
            services.run_fail(
                run_id=run_id, code="invalid_plan", message=str(exc)[:2000], actor=actor
            )
            return False
        begin(run, plan, actor)
        return True


def resume(run_id: Any, actor: str = "worker") -> bool:
    """RESUMING -> RUNNING: re-dispatch what the pause held, then carry on.

    Agents and tasks that were already under way go back to RUNNING; their dispatched
    steps whose messages were dropped while paused are published again (a duplicate
    of a message still queued is harmless: the claim lets one through).

    What the pause held comes first: a run one of whose agents failed for good while
    it was paused fails now (``runs.engine.failure.held_failure``), and one whose
    failures opened an escalation ticket meanwhile escalates (``policy.escalation_held``).

    A run whose organization was suspended since its resume was asked for is paused
    again at once, by the suspension (``run_admission.SUSPENSION_ACTOR``), instead of going
    on: the suspension leaves runs caught resuming to this (runs/people/suspension.py), and
    unsuspending resumes them with the others it paused.
    """
    with transaction.atomic():
        run = services.lock_run(run_id, light=True)
        if run.status != RunStatus.RESUMING:
            return False
        # Read under the run's lock: a suspension that listed the run before this lock
        # was had committed the organization's row first (runs/people/suspension.py).
        suspended = Organization.objects.filter(
            pk=run.organization_id, suspended_at__isnull=False
        ).exists()
        now = timezone.now()
        for model in (Agent, Task):
            transition_many(
                model,  # type: ignore[type-var]
                model.objects.filter(
                    run=run,
                    attempt_number=run.attempt_number,
                    status=NodeStatus.PENDING,
                    dispatched_at__isnull=False,
                ),
                NodeStatus.RUNNING,
                from_states=[NodeStatus.PENDING],
                actor=actor,
                now=now,
            )
        run = services.run_resumed(run_id=run.pk, actor=actor)
        if suspended:
            services.run_pause(run_id=run.pk, actor=run_admission.SUSPENSION_ACTOR)
            return True
        # What the pause held: a failure for good ends the run now (and retries it if
        # its plan says so), a ticket opened meanwhile escalates it.
        failure = held_failure(run)
        if failure is not None:
            run_failed(run, failure)
        elif not escalation_held(run, now):
            redispatch(run, now)
        return True


def redispatch(run: Run, now: datetime) -> None:
    """A RUNNING run that stood still (paused, escalated) goes on: its dispatched steps
    are published again (a message dropped meanwhile; one still queued makes a harmless
    duplicate), each no sooner than it is due, then whatever became ready is dispatched.
    Everything may have finished meanwhile: then the run completes."""
    outbox = Outbox()
    held = Step.objects.filter(
        run=run,
        attempt_number=run.attempt_number,
        status=StepStatus.PENDING,
        dispatched_at__isnull=False,
    )
    # Those due beyond the step-message horizon get no message: the wake sweep sends each
    # when its time comes within it (``runs.outbox.asleep``).
    horizon = now + timedelta(seconds=settings.RATE_LIMIT_MAX_COUNTDOWN_S)
    held.filter(next_run_at__gt=horizon).update(asleep=True)
    held.filter(asleep=True).exclude(next_run_at__gt=horizon).update(asleep=False)
    for step in held.only("pk", "timeout_ms", "next_run_at"):
        wait = (step.next_run_at - now).total_seconds() if step.next_run_at else 0.0
        outbox.add(StepMessage(step.pk, str(run.pk), run.priority, step.timeout_s, max(wait, 0.0)))
    dispatch(run, run, outbox)
    for agent in Agent.objects.filter(
        run=run, attempt_number=run.attempt_number, status=NodeStatus.RUNNING
    ).only("pk"):
        dispatch(run, agent, outbox)
    for task in Task.objects.filter(
        run=run, attempt_number=run.attempt_number, status=NodeStatus.RUNNING
    ).only("pk"):
        dispatch(run, task, outbox)
    update_waiting_state(run)
    finish_if_done(run)
