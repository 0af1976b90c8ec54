"""A run's start: CREATED -> PENDING, and RUNNING in the same transaction when it may.

``run_start`` is the one door every client's start goes through (the API, the admin,
schedules, a parent's child run). A small plan (ENGINE_START_AT_ONCE_STEPS) of a run that
looks admissible (``run_admission.looks_free``) is begun at once, in the start's own
transaction: its first steps are claimable at commit and their doorbells rung after it.
The organization's locks (admission's, then its row for the reservation) are taken
*last*, after the run is materialised, and held only for the admission check, the
reservation and the commit: one organization's starts do their heavy part side by side
(docs/benchmark.md, "Many small runs"). When admission then says no (a race took the
place), the begun run is rolled back to a savepoint and started as a waiting one.
Otherwise (``run_start_pending``: admission asked first) a worker picks the run
up (``control.pick_up``), asked for after commit.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from billing.models import Organization
from billing.services import credits_reserve, to_credits
from common import eventstreams, tracing
from runs import services
from runs.admission import run_admission
from runs.engine import hotpath
from runs.engine.dispatch import announce, dispatch, step_from_row
from runs.engine.propagation import finish_if_done
from runs.models import Run, RunAttempt
from runs.outbox import Outbox, RunMessage, enqueue_run_message
from runs.plan import Limits, Plan
from runs.plan.checks import check_plan
from runs.plan.guard import refused_whole
from runs.plan.model import read_plan
from runs.reservation import plan_reservation
from runs.states import RUN_TERMINAL, RunStatus
from runs.transitions import transition


@transaction.atomic
def run_start(
    *,
    run_id: services.RunId,
    organization: Organization | None = None,
    actor: str = "system",
    plan: Plan | None = None,
) -> Run:
    """CREATED -> PENDING, then RUNNING at once when admitted with a small plan, else a
    pick-up asked for (module doc). Started already (pending, running or any state its
    start led to, short of a terminal one): returned unchanged. Too little available:
    InsufficientCredits, and the whole transaction rolls back, so the run stays CREATED.

    ``plan``: the run's plan as ``services.run_create_checked`` checked it in this
    transaction, not read again; None: read from the run (``stored_plan``).
    """
    starting = run_to_start(run_id=run_id, organization=organization, actor=actor, plan=plan)
    if starting.plan is None:
        return starting.run
    if starting.plan.step_count <= settings.ENGINE_START_AT_ONCE_STEPS and run_admission.looks_free(
        starting.run
    ):
        begun = _begin_then_admit(starting, actor)
        if begun is not None:
            return begun
    pending = run_start_pending(starting, actor=actor)
    run, plan = pending.run, pending.plan
    if pending.attempt is None or plan is None:
        return run
    small = plan.step_count <= settings.ENGINE_START_AT_ONCE_STEPS
    if pending.admitted and small and _checked(starting):
        # Admitted after all (a place freed since the guess): begun under the locks.
        return begin(run, plan, actor, pending.attempt)
    enqueue_run_message(RunMessage.PICK_UP, run.pk, run.priority)
    return run


def _checked(starting: Starting) -> bool:
    """Whether the run's plan passes every check now, as a pick-up checks it before it
    begins a run; not for a plan the validator has grown stricter for since its creation,
    left to the pick-up, which fails the run. Its model was read by ``run_to_start``: what
    ``parse_plan`` adds is asked here of the same JSON, the whole plan's guard and checks,
    not the model again."""
    if starting.checked:
        return True
    data, limits = starting.run.plan, Limits.from_settings()
    return not refused_whole(data, limits, None) and not check_plan(data, limits)


class _NotAdmitted(Exception):
    """Admission said no to a run begun on its guess: the savepoint is rolled back."""


def _begin_then_admit(starting: Starting, actor: str) -> Run | None:
    """Begin the run, then take the organization's locks and ask admission; reserve its
    credits last. None, with nothing written, when admission lets it wait after all or
    its plan must be left to a pick-up: the caller starts it as a waiting run."""
    run, plan = starting.run, starting.plan
    if plan is None or not _checked(starting):
        return None
    try:
        with transaction.atomic():  # a savepoint: undone whole when admission says no
            pending = run_start_pending(starting, actor=actor, admitted=True)
            assert pending.attempt is not None
            begin(run, plan, actor, pending.attempt)
            # Ended as it began (nothing to run): its attempt closed and settled a
            # reservation not made yet. Rare; started the general way instead.
            if run.status in RUN_TERMINAL or not run_admission.on_start(run):
                raise _NotAdmitted
            run_reserve(run, pending.attempt, starting.amount, actor)
    except _NotAdmitted:
        run.refresh_from_db()
        return None
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
        dispatch(run, run, Outbox())
    else:
        announce(run, [step_from_row(row) for row in started.dispatched], Outbox())
    finish_if_done(run)
    if run.open_children == 0:
        run.refresh_from_db()  # nothing to do: completed as it started
    return run


# --------------------------------------------------------------------------- its parts
# The states a run's start leads to, short of a terminal one: starting it again there
# answers the run as it is (a client retrying its start never sees a conflict because
# the first start was fast).
STARTED = frozenset(
    {
        RunStatus.PENDING,
        RunStatus.RUNNING,
        RunStatus.WAITING_APPROVAL,
        RunStatus.PAUSED,
        RunStatus.RESUMING,
        RunStatus.RETRYING,
        RunStatus.ESCALATED,
    }
)


@dataclass(frozen=True)
class Starting:
    """A run locked for its start (``run_to_start``): its plan as stored, whether that
    plan was checked in full in this transaction (handed over by its creation) and the
    credits its first attempt reserves. ``plan`` None: the run was started before and is
    returned as it is."""

    run: Run
    plan: Plan | None = None
    amount: Decimal = Decimal(0)
    checked: bool = False


@dataclass(frozen=True)
class Pending:
    """What ``run_start_pending`` did: the run; attempt 1, opened now (None: the run was
    started before, and is returned as it is); whether admission let it in at once."""

    run: Run
    attempt: RunAttempt | None = None
    admitted: bool = False
    plan: Plan | None = None


def run_to_start(
    *,
    run_id: services.RunId,
    organization: Organization | None = None,
    actor: str = "system",
    plan: Plan | None = None,
) -> Starting:
    """The run locked (in the caller's transaction) and checked for its start: deleted,
    refused; started already (pending, running or any state its start led to, short of a
    terminal one), returned as it is; a terminal state, refused by the transition table.
    ``plan``: the run's plan checked in full by the caller (``run_start``)."""
    run = services.lock_run(run_id, organization)
    if run.deleted_at is not None:
        raise services.RunDeleted(f"run {run.pk} was deleted")
    if run.status != RunStatus.CREATED:
        if run.status in STARTED:
            return Starting(run)
        # A terminal state start() can never lead to: the table refuses it explicitly.
        return Starting(transition(Run, run.pk, RunStatus.PENDING, actor=actor).obj)
    if tracing.enabled:
        _trace_start(run)
    checked = plan is not None
    if plan is None:
        plan = stored_plan(run)
    amount = to_credits(plan_reservation(plan, run.reuse))
    if amount <= 0:
        raise ValueError("a reservation must be positive")
    return Starting(run, plan, amount, checked)


def run_start_pending(starting: Starting, *, actor: str, admitted: bool | None = None) -> Pending:
    """CREATED -> PENDING for a run ``run_to_start`` locked: attempt 1 opened
    (``runs.run_start``). ``admitted`` None: admission is asked whether a place is free
    at once (``runs.admission.run_admission.on_start``: its lock on the organization held until
    commit) and the credits are reserved here (InsufficientCredits when short: the
    caller's transaction rolls back, the run stays CREATED). ``admitted`` True: the
    caller takes the organization's locks last, after it has begun the run
    (``runs.engine.start``): it asks admission itself and reserves with
    ``run_reserve`` before it commits."""
    run, plan = starting.run, starting.plan
    if plan is None:
        return Pending(run)
    reserve = admitted is None
    if admitted is None:
        # Refused with 429 beyond the organization's pending runs; admitted at once when
        # a place is free and nobody waits for one (runs.admission.run_admission).
        admitted = run_admission.on_start(run)
    admitted_at = timezone.now() if admitted else None
    now = timezone.now()
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT * FROM runs.run_start(%s, %s, %s, %s, %s, %s)",
            [run.pk, starting.amount, actor, admitted_at, now, reserve],
        )
        row = cursor.fetchone()
    if row[3] is None:
        raise services.short_of_credits(run.organization_id, starting.amount)
    eventstreams.events_written(run.pk)  # the function wrote the start's events
    run.status, run.attempt_number, run.admitted_at = RunStatus.PENDING, 1, admitted_at
    run.status_changed_at, run.started_at, run.updated_at, attempt_id = row
    attempt = RunAttempt.from_db(
        connection.alias, ["id", "run_id", "attempt_number"], [attempt_id, run.pk, 1]
    )
    return Pending(run, attempt, admitted, plan)


def run_reserve(run: Run, attempt: RunAttempt, amount: Decimal, actor: str) -> None:
    """Reserve the credits of a start that opened its attempt without them
    (``run_start_pending(admitted=True)``): InsufficientCredits when short."""
    credits_reserve(
        organization_id=run.organization_id,
        run_id=run.pk,
        attempt_id=attempt.pk,
        attempt_number=attempt.attempt_number,
        amount=amount,
        actor=actor,
    )


def _trace_start(run: Run) -> None:
    """A run created untraced is traced from the request that starts it; the start of a
    traced run is linked to the run's trace from the starting request's."""
    if not run.trace_context:
        run.trace_context = tracing.run_context(attributes={"orchestrator.run.name": run.name})
        Run.objects.filter(pk=run.pk).update(trace_context=run.trace_context)
        return
    tracing.link_current(run.trace_context, relation="run started")


def stored_plan(run: Run) -> Plan:
    """The typed plan of a stored run, for what its start reads of it (the steps, the
    credits to reserve). The plan passed every check when the run was created: its shape
    is read again (the typed plan is built from it), not its whole-plan checks
    (dependencies, cycles, templates), which the pick-up makes before it writes, and a
    start before it begins the run (``_checked``); a plan whose shape no longer reads is
    refused in full, as at creation."""
    plan, problems = read_plan(run.plan, Limits.from_settings())
    if problems or plan is None:
        return services.plan_of(run)  # raises PlanInvalid with every problem
    return plan
