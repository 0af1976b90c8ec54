"""Fair dispatch: which run a worker serves next, and the slots that cap how many steps
of one organization execute at once (docs/fairness.md).

Ready steps are claimable rows (``runs.transitions.claim_next_step``); Celery carries the
doorbells that wake workers and is the fleet. What a worker serves is decided here, on
PostgreSQL's rows: every ENGINE_FAIR_SLICE seconds a worker serving steps asks
``next_run`` again (the database's ``runs.run_choose``, runs/sql/run_choose.sql),
which looks at every organization with work ready (a running run with a claimable step,
or a run waiting to be picked up) and chooses

1. the organization with the fewest steps executing, weighted by its `share`;
2. among those alike, the one served longest ago (``FairTurn``): round robin;
3. within it, the run first by priority, then the oldest (FIFO).

So a small run of one organization is served within a slice, however many steps another
organization has ready, and three organizations busy at once take turns.

A worker executing an organization's steps holds one of its ``max_running_steps`` slots
(``StepSlot``), a row taken with a conditional update: never more than that many hold
one, whatever the races. A slot is renewed while its holder lives (the heartbeat), and
one whose holder died lets go when its lease passes.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import connection
from django.db.models import Count, OuterRef, Q, QuerySet, Subquery
from django.db.models.functions import Coalesce
from django.utils import timezone

from billing.models import Organization
from runs.admission.run_admission import HOLDS_A_PLACE, TOP, WAITING, OrgLimits, limits_of
from runs.models import Run, StepSlot
from runs.queries import QUERIES
from runs.states import RunStatus
from runs.transitions import claimed_from_json


@dataclass(frozen=True)
class Slot:
    """A slot held: an organization's, by ``holder``."""

    id: int
    organization_id: Any
    slot: int
    holder: str
    # The organization's max_running_steps as the slot was taken (0: not known): a
    # server's batch claims no more (orchestrator.executor).
    limit: int = 0


def acquire_slot(organization_id: Any, holder: str) -> Slot | None:
    """One of the organization's free slots (below its limit as it stands now), or None
    when they are all held."""
    params = {
        "organization": organization_id,
        "default": settings.ORG_MAX_RUNNING_STEPS,
        "holder": holder,
        "lease": float(settings.ENGINE_LEASE_SECONDS),
    }
    with connection.cursor() as cursor:
        for _ in range(3):  # a number taken by another worker at the same moment: again
            cursor.execute(QUERIES["step_slot_take"], params)
            row = cursor.fetchone()
            if row is None:
                cursor.execute(QUERIES["step_slot_add"], params)
                row = cursor.fetchone()
            if row is not None:
                return Slot(row[0], organization_id, row[1], holder, int(row[2]))
            if not _below_limit(cursor, params):
                return None
    return None


def _below_limit(cursor: Any, params: dict[str, Any]) -> bool:
    cursor.execute(QUERIES["step_slot_room"], params)
    return bool(cursor.fetchone()[0])


def renew_slot(slot: Slot) -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE runs_stepslot SET expires_at = now() + make_interval(secs => %s) "
            "WHERE id = %s AND holder = %s",
            [float(settings.ENGINE_LEASE_SECONDS), slot.id, slot.holder],
        )
        return bool(cursor.rowcount)


def release_slot(slot: Slot) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE runs_stepslot SET holder = '', expires_at = NULL WHERE id = %s AND holder = %s",
            [slot.id, slot.holder],
        )


def steps_executing(organization_id: Any) -> int:
    """The organization's slots held now (its steps executing on workers)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM runs_stepslot WHERE organization_id = %s AND holder <> '' "
            "AND expires_at >= now()",
            [organization_id],
        )
        return int(cursor.fetchone()[0])


# --------------------------------------------------------------------------- next run
@dataclass(frozen=True)
class Choice:
    """The run to serve next: its steps, or its pick-up (``pickup``); with its next step
    claimed for the asking worker when it asked and could (``claimed``, the fields
    ``transitions.claim_next_step`` returns)."""

    run_id: Any
    organization_id: Any
    priority: int
    pickup: bool
    claimed: dict[str, Any] | None = None
    # Other workers executing the organization's steps: each worker of a busy
    # organization looks again every ENGINE_FAIR_SLICE x (busy + 1), so that the fleet
    # as a whole looks again about once a slice, whatever its size.
    busy: int = 0


# The choice (and the claim with it) is runs.run_choose: runs/sql/run_choose.sql.
_NEXT_SQL = "SELECT * FROM runs.run_choose(%s, %s::uuid[], %s::uuid[], %s, %s, %s, %s)"


@dataclass(frozen=True)
class ClaimFor:
    """A worker that would claim the chosen run's next step with the choice: the slot
    it holds (the step must be its organization's) and ``claim_next_step``'s terms."""

    slot: Slot
    worker: str
    task_id: str
    lease_seconds: float


def next_run(
    *,
    me: str = "",
    full: frozenset[Any] = frozenset(),
    skip: frozenset[Any] = frozenset(),
    claim: ClaimFor | None = None,
) -> Choice | None:
    """The run a worker should serve next, fairly between organizations (see the module),
    or None when there is no work ready. ``me``: the holder name of the asking worker's
    slot; ``full``: organizations whose slots it found all held; ``skip``: runs it could
    not serve just now. With ``claim``, the chosen run's next step is claimed for that
    worker in the same statement when the run is its slot's organization's and running
    (``Choice.claimed``)."""
    held, worker, task_id, lease = None, "", "", 0.0
    if claim is not None:
        held, worker, task_id = claim.slot.organization_id, claim.worker, claim.task_id
        lease = claim.lease_seconds
    with connection.cursor() as cursor:
        cursor.execute(_NEXT_SQL, [me, list(full), list(skip), held, worker, task_id, lease])
        rows = cursor.fetchall()
    if not rows:
        return None
    row = rows[0]
    return Choice(
        run_id=row[1],
        organization_id=row[0],
        priority=int(row[2]),
        pickup=bool(row[3]),
        busy=int(row[4] or 0),
        claimed=None if row[5] is None else claimed_from_json(row[5]),
    )


def served(organization_id: Any, now: datetime | None = None) -> None:
    """The organization was just given a worker (its turn comes after the others')."""
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO runs_fairturn (organization_id, served_at) VALUES (%s, %s) "
            "ON CONFLICT (organization_id) DO UPDATE SET served_at = EXCLUDED.served_at",
            [organization_id, now or timezone.now()],
        )


# --------------------------------------------------------------------------- load
@dataclass(frozen=True)
class OrganizationLoad:
    """An organization's limits as they stand, and how much of them is in use."""

    limits: OrgLimits
    runs_running: int  # holding a place: started and not ended (or admitted)
    runs_queued: int  # waiting for a place (with a queued_reason)
    runs_pending: int  # PENDING, admitted or not (what max_pending_runs counts; no children)
    steps_executing: int  # slots held now


def organization_load(organization_id: Any) -> OrganizationLoad:
    counts = Run.objects.filter(organization_id=organization_id).aggregate(
        running=Count("pk", filter=HOLDS_A_PLACE),
        queued=Count("pk", filter=WAITING & ~Q(queued_reason="")),
        pending=Count("pk", filter=TOP & Q(status=RunStatus.PENDING)),
    )
    return OrganizationLoad(
        limits=limits_of(organization_id),
        runs_running=int(counts["running"]),
        runs_queued=int(counts["queued"]),
        runs_pending=int(counts["pending"]),
        steps_executing=steps_executing(organization_id),
    )


def _count_of(runs: QuerySet[Run]) -> Coalesce:
    counted = runs.filter(organization_id=OuterRef("pk")).order_by().values("organization_id")
    return Coalesce(Subquery(counted.annotate(n=Count("pk")).values("n")[:1]), 0)


def with_load(organizations: QuerySet[Organization]) -> QuerySet[Organization]:
    """Organizations annotated with ``runs_running``, ``runs_queued`` and
    ``steps_executing`` (one query for a whole admin page)."""
    slots = (
        StepSlot.objects.filter(organization_id=OuterRef("pk"), expires_at__gte=timezone.now())
        .exclude(holder="")
        .order_by()
        .values("organization_id")
        .annotate(n=Count("pk"))
        .values("n")[:1]
    )
    return organizations.annotate(
        runs_running=_count_of(Run.objects.filter(HOLDS_A_PLACE)),
        runs_queued=_count_of(Run.objects.filter(WAITING).exclude(queued_reason="")),
        steps_executing=Coalesce(Subquery(slots), 0),
    )
