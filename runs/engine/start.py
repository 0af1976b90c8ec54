"""A run's start: CREATED -> PENDING, and RUNNING in the same transaction when it may.

``run_start`` is the one door every client's start goes through (the API, the admin,
schedules, a parent's child run). Its first half is ``services.run_start_pending``
(attempt 1 opened, its credits reserved, admission asked). When admission let the run in
at once and its plan is small (ENGINE_START_AT_ONCE_STEPS), it ``begin``s here, in the
start's own transaction: its first steps are claimable at commit and their doorbells rung
after it. Otherwise a worker picks it up (``control.pick_up``), asked for after commit.
"""

from __future__ import annotations

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from billing.models import Organization
from runs import services
from runs.engine import hotpath
from runs.engine.dispatch import announce, dispatch_agents, step_from_row
from runs.engine.propagation import finish_if_done
from runs.models import Run, RunAttempt
from runs.outbox import Outbox, RunMessage, enqueue_run_message
from runs.plan import Plan, PlanInvalid


@transaction.atomic
def run_start(
    *, run_id: services.RunId, organization: Organization | None = None, actor: str = "system"
) -> Run:
    """CREATED -> PENDING, then RUNNING at once when admitted with a small plan, else a
    pick-up asked for (module doc). Started already (pending, running or any state its
    start led to, short of a terminal one): returned unchanged. Too little available:
    InsufficientCredits, and the whole transaction rolls back, so the run stays CREATED.
    """
    pending = services.run_start_pending(run_id=run_id, organization=organization, actor=actor)
    run, plan = pending.run, pending.plan
    if pending.attempt is None or plan is None:
        return run
    if pending.admitted and plan.step_count <= settings.ENGINE_START_AT_ONCE_STEPS:
        # Checked in full first, as a pick-up checks it: a plan the validator has grown
        # stricter for since its creation is left to the pick-up, which fails the run.
        try:
            checked = services.plan_of(run)
        except PlanInvalid:
            checked = None
        if checked is not None:
            return begin(run, checked, actor, pending.attempt)
    enqueue_run_message(RunMessage.PICK_UP, run.pk, run.priority)
    return run


def begin(run: Run, plan: Plan, actor: str, attempt: RunAttempt | None = None) -> Run:
    """PENDING -> RUNNING for a run locked in the caller's transaction, its plan parsed:
    its attempt materialised, its ready agents, tasks and steps started (the steps'
    doorbells rung after commit). A pick-up's work (``control.pick_up``), and a start's
    for a run admitted at once whose plan is small."""
    run = services.run_pick_up_locked(run, plan, actor=actor, attempt=attempt)
    now = timezone.now()
    started = hotpath.start(run, now)
    if started is None:
        dispatch_agents(run, Outbox())
    else:
        run.active_children += started.agents
        announce(run, [step_from_row(row) for row in started.dispatched], now, Outbox())
    finish_if_done(run)
    if run.open_children == 0:
        run.refresh_from_db()  # nothing to do: completed as it started
    return run
