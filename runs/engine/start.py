"""A run's start: CREATED -> PENDING, and RUNNING in the same transaction when it may.

``run_start`` is the one door every client's start goes through (the API, the admin,
schedules, a parent's child run). A small plan (ENGINE_START_AT_ONCE_STEPS) of a run that
looks admissible (``admission.looks_free``) is begun at once, in the start's own
transaction: its first steps are claimable at commit and their doorbells rung after it.
The organization's locks (admission's, then its row for the reservation) are taken
*last*, after the run is materialised, and held only for the admission check, the
reservation and the commit: one organization's starts do their heavy part side by side
(docs/benchmark.md, "Many small runs"). When admission then says no (a race took the
place), the begun run is rolled back to a savepoint and started as a waiting one.
Otherwise (``services.run_start_pending``: admission asked first) a worker picks the run
up (``control.pick_up``), asked for after commit.
"""

from __future__ import annotations

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from billing.models import Organization
from runs import admission, services
from runs.engine import hotpath
from runs.engine.dispatch import announce, dispatch_agents, step_from_row
from runs.engine.propagation import finish_if_done
from runs.models import Run, RunAttempt
from runs.outbox import Outbox, RunMessage, enqueue_run_message
from runs.plan import Plan, PlanInvalid
from runs.states import RUN_TERMINAL


@transaction.atomic
def run_start(
    *, run_id: services.RunId, organization: Organization | None = None, actor: str = "system"
) -> Run:
    """CREATED -> PENDING, then RUNNING at once when admitted with a small plan, else a
    pick-up asked for (module doc). Started already (pending, running or any state its
    start led to, short of a terminal one): returned unchanged. Too little available:
    InsufficientCredits, and the whole transaction rolls back, so the run stays CREATED.
    """
    starting = services.run_to_start(run_id=run_id, organization=organization, actor=actor)
    if starting.plan is None:
        return starting.run
    if starting.plan.step_count <= settings.ENGINE_START_AT_ONCE_STEPS and admission.looks_free(
        starting.run
    ):
        begun = _begin_then_admit(starting, actor)
        if begun is not None:
            return begun
    pending = services.run_start_pending(starting, actor=actor)
    run, plan = pending.run, pending.plan
    if pending.attempt is None or plan is None:
        return run
    if pending.admitted and plan.step_count <= settings.ENGINE_START_AT_ONCE_STEPS:
        # Admitted after all (a place freed since the guess): begun under the locks.
        checked = _checked(run)
        if checked is not None:
            return begin(run, checked, actor, pending.attempt)
    enqueue_run_message(RunMessage.PICK_UP, run.pk, run.priority)
    return run


class _NotAdmitted(Exception):
    """Admission said no to a run begun on its guess: the savepoint is rolled back."""


def _begin_then_admit(starting: services.Starting, actor: str) -> Run | None:
    """Begin the run, then take the organization's locks and ask admission; reserve its
    credits last. None, with nothing written, when admission lets it wait after all or
    its plan must be left to a pick-up: the caller starts it as a waiting run."""
    run = starting.run
    checked = _checked(run)
    if checked is None:
        return None
    try:
        with transaction.atomic():  # a savepoint: undone whole when admission says no
            pending = services.run_start_pending(starting, actor=actor, admitted=True)
            assert pending.attempt is not None
            begin(run, checked, actor, pending.attempt)
            # Ended as it began (nothing to run): its attempt closed and settled a
            # reservation not made yet. Rare; started the general way instead.
            if run.status in RUN_TERMINAL or not admission.on_start(run):
                raise _NotAdmitted
            services.run_reserve(run, pending.attempt, starting.amount, actor)
    except _NotAdmitted:
        run.refresh_from_db()
        return None
    return run


def _checked(run: Run) -> Plan | None:
    """The run's plan checked in full, as a pick-up checks it; None for a plan the
    validator has grown stricter for since its creation: left to the pick-up, which fails
    the run."""
    try:
        return services.plan_of(run)
    except PlanInvalid:
        return None


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
