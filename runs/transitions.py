"""The one door through which every state change passes.

``transition()`` locks the row (``SELECT ... FOR NO KEY UPDATE``), checks the entity's table in
``runs.states``, sets the timestamps that go with the new state, saves, and writes a
RunEvent, all in one transaction. Asking for the state a row is already in is a no-op
that returns it unchanged and writes nothing. Anything else not in the table raises
``InvalidTransition`` and changes nothing.

The lock is FOR NO KEY UPDATE, not FOR UPDATE: it serialises state changes just the
same, but does not block the KEY SHARE locks that PostgreSQL takes on a run when a child
row or a RunEvent referencing it is inserted. With FOR UPDATE, a service holding the run
and waiting for a step deadlocks with a step transition waiting to insert its event.

``transition_many()`` is the same for a set of rows at once (cascades such as cancelling
every pending step of a run): rows not in one of the given source states are left alone.

Every event written here (and by the claims below) tells ``common.eventstreams``, which
wakes the run's live event streams after commit when it has any.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, TypeVar
from uuid import UUID

from django.db import connection, models, transaction
from django.utils import timezone

from common import eventstreams
from runs.models import Agent, EventKind, Run, RunEvent, Step, Task
from runs.states import TERMINAL, InvalidTransition, check_transition, is_allowed

Entity = TypeVar("Entity", Run, Agent, Task, Step)

ENTITY_NAMES: dict[type[models.Model], str] = {
    Run: "run",
    Agent: "agent",
    Task: "task",
    Step: "step",
}


@dataclass(frozen=True)
class Transition(Generic[Entity]):
    obj: Entity
    changed: bool
    from_status: str


def entity_name(model: type[models.Model]) -> str:
    return ENTITY_NAMES[model]


def _apply(obj: Run | Agent | Task | Step, entity: str, to_status: str, now: datetime) -> list[str]:
    """Set status and the timestamps the new state implies; return the changed fields."""
    obj.status = to_status
    obj.status_changed_at = now
    fields = ["status", "status_changed_at"]
    if entity == "run":
        assert isinstance(obj, Run)
        if to_status == "pending" and obj.started_at is None:
            obj.started_at = now
            fields.append("started_at")
        elif to_status == "running" and obj.picked_up_at is None:
            obj.picked_up_at = now
            fields.append("picked_up_at")
        elif to_status == "retrying":
            # The run is no longer finished; the next attempt gets its own clock.
            obj.completed_at = obj.duration_ms = obj.picked_up_at = None
            fields += ["completed_at", "duration_ms", "picked_up_at"]
        if to_status == "cancelled":
            obj.cancelled_at = now
            fields.append("cancelled_at")
        fields.append("updated_at")
    elif to_status == "running" and obj.started_at is None:
        obj.started_at = now
        fields.append("started_at")
    if to_status in TERMINAL[entity]:
        obj.completed_at = now
        begin = obj.started_at or obj.created_at
        obj.duration_ms = max(0, int((now - begin).total_seconds() * 1000))
        fields += ["completed_at", "duration_ms"]
    return fields


def _event(
    obj: Run | Agent | Task | Step,
    entity: str,
    from_status: str,
    to_status: str,
    *,
    actor: str,
    message: str,
    payload: Mapping[str, Any] | None,
    kind: str = EventKind.TRANSITION,
) -> RunEvent:
    run_id = obj.pk if isinstance(obj, Run) else obj.run_id
    return RunEvent(
        run_id=run_id,
        attempt_number=obj.attempt_number,
        entity=entity,
        entity_id=str(obj.pk),
        kind=kind,
        from_status=from_status,
        to_status=to_status,
        actor=actor,
        message=message,
        payload=dict(payload or {}),
    )


# --------------------------------------------------------------------------- the gate
# A run's gate: the lock that keeps the hot path's recordings apart from everything else
# that changes the run (docs/engine.md, "Locks"). Recordings of the run's steps take it
# shared, inside the hot path's function (runs.engine.hotpath), and so overlap; every
# other change of the run takes it exclusively first (``lock_gate``: services.lock_run,
# and transition() of a run), waits for the recordings under way and holds new ones
# off until it commits. A transaction-scoped advisory lock, not the run's row lock in
# share mode: PostgreSQL queues advisory lock requests in order, so a cancel waits for
# the recordings already in, never for a stream of new ones, where share locks on the
# row could keep a waiting writer out for as long as recordings overlapped. (The
# hash of two runs may meet: they then share a gate, which costs waiting, never
# correctness.)
GATE_NAMESPACE = 0x6761_7465  # "gate"; admission's organization lock has its own


def lock_gate(run_id: Any) -> None:
    """Close the run's gate for the rest of the transaction (exclusive)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_advisory_xact_lock(%s, hashtext(%s::uuid::text))",
            [GATE_NAMESPACE, str(run_id)],
        )


def transition(
    model: type[Entity],
    pk: Any,
    to_status: str,
    *,
    actor: str = "system",
    message: str = "",
    payload: Mapping[str, Any] | None = None,
    updates: Mapping[str, Any] | None = None,
    now: datetime | None = None,
) -> Transition[Entity]:
    """Move one row to ``to_status``; ``updates`` are extra fields saved with it.

    Raises ``model.DoesNotExist`` for an unknown pk and ``InvalidTransition`` for a
    transition the table refuses.
    """
    # No savepoint inside a caller's transaction: the engine makes several transitions
    # per step, each a SAVEPOINT and a RELEASE round trip otherwise. The refusals are
    # decided before anything is written and raised outside the block, so a caller that
    # catches one (and a test) carries on in a usable transaction; only a database error
    # leaves through the block, and that spoils the caller's transaction either way.
    entity = entity_name(model)
    with transaction.atomic(savepoint=False):
        if model is Run:
            lock_gate(pk)  # a run changes with no recording of its steps under way
        obj = model.objects.select_for_update(no_key=True).filter(pk=pk).first()
        if obj is not None and (
            obj.status == to_status or is_allowed(entity, obj.status, to_status)
        ):
            return transition_locked(
                obj,
                to_status,
                actor=actor,
                message=message,
                payload=payload,
                updates=updates,
                now=now,
            )
    if obj is None:
        raise model.DoesNotExist(f"{model.__name__} {pk} does not exist")
    raise InvalidTransition(entity, obj.status, to_status)


def transition_locked(
    obj: Entity,
    to_status: str,
    *,
    actor: str = "system",
    message: str = "",
    payload: Mapping[str, Any] | None = None,
    updates: Mapping[str, Any] | None = None,
    now: datetime | None = None,
) -> Transition[Entity]:
    """``transition()`` for a row the caller has already locked in this transaction.

    The engine's hot path (a step finishing) holds the step's lock already; this saves
    re-reading the row. The caller must be inside that same transaction.
    """
    entity = entity_name(type(obj))
    from_status = obj.status
    if not check_transition(entity, from_status, to_status):
        return Transition(obj, False, from_status)
    now = now or timezone.now()
    fields = _apply(obj, entity, to_status, now)
    for name, value in (updates or {}).items():
        setattr(obj, name, value)
        fields.append(name)
    obj.save(update_fields=fields)
    event = _event(
        obj, entity, from_status, to_status, actor=actor, message=message, payload=payload
    )
    event.save()
    eventstreams.events_written(event.run_id)  # its live streams woken after commit
    return Transition(obj, True, from_status)


def transition_many(
    model: type[Entity],
    rows: models.QuerySet[Entity],
    to_status: str,
    *,
    from_states: Iterable[str],
    actor: str = "system",
    message: str = "",
    payload: Mapping[str, Any] | None = None,
    updates: Mapping[str, Any] | None = None,
    now: datetime | None = None,
) -> list[Entity]:
    """Move every row of ``rows`` that is in ``from_states`` to ``to_status``.

    Each source state must be allowed by the table (checked up front, so a caller's
    mistake fails loudly rather than silently skipping rows). Returns the changed rows.
    """
    entity = entity_name(model)
    sources = set(from_states) - {to_status}
    for source in sources:
        if not is_allowed(entity, source, to_status):
            check_transition(entity, source, to_status)  # raises with the details
    with transaction.atomic(savepoint=False):  # as in transition()
        locked = list(rows.select_for_update(no_key=True).filter(status__in=sources).order_by("pk"))
        if not locked:
            return []
        now = now or timezone.now()
        events = []
        fields: set[str] = set()
        for obj in locked:
            from_status = obj.status
            fields.update(_apply(obj, entity, to_status, now))
            for name, value in (updates or {}).items():
                setattr(obj, name, value)
                fields.add(name)
            events.append(
                _event(
                    obj,
                    entity,
                    from_status,
                    to_status,
                    actor=actor,
                    message=message,
                    payload=payload,
                )
            )
        model.objects.bulk_update(locked, sorted(fields), batch_size=500)
        RunEvent.objects.bulk_create(events, batch_size=500)
        for run_id in {event.run_id for event in events}:
            eventstreams.events_written(run_id)
        return locked


def record_event(
    run: Run,
    kind: str,
    *,
    actor: str = "system",
    message: str = "",
    payload: Mapping[str, Any] | None = None,
    entity: str = "run",
    entity_id: str | None = None,
) -> RunEvent:
    """Append a non-transition event (a charge, an approval, an operator note...)."""
    event = RunEvent.objects.create(
        run=run,
        attempt_number=run.attempt_number,
        entity=entity,
        entity_id=entity_id or str(run.pk),
        kind=kind,
        actor=actor,
        message=message,
        payload=dict(payload or {}),
    )
    eventstreams.events_written(run.pk)
    return event


# --------------------------------------------------------------------------- the claim
# A worker's PENDING -> RUNNING is the hottest transition: one statement moves the step,
# writes its event and returns what the attempt needs, instead of transition()'s lock,
# read, save and insert. It is still this module's: the table must allow it.
if not is_allowed("step", "pending", "running"):
    raise RuntimeError("runs.states no longer allows step pending -> running; fix claim_step")

_CLAIM_TEMPLATE = """
WITH {before}{pick}claimed AS (
    UPDATE runs_step AS s
    SET status = 'running',
        attempts = s.attempts + 1,
        started_at = COALESCE(s.started_at, now()),
        status_changed_at = now(),
        lease_expires_at = now() + make_interval(secs => %(lease)s),
        next_run_at = NULL,
        worker = %(worker)s,
        celery_task_id = %(task_id)s
    WHERE s.id = {step}
      AND s.status = 'pending'
      AND s.dispatched_at IS NOT NULL
      AND (s.next_run_at IS NULL OR s.next_run_at <= now())
      -- The run by its key: as a join, a generic plan made while few runs were running
      -- scanned every running run for it.
      AND (SELECT r.status FROM runs_run AS r WHERE r.id = s.run_id) = 'running'
    RETURNING s.id, s.run_id, s.attempt_number, s.attempts, s.task_id, s.generation, s.name,
              s.tool, s.params, s."when", s.timeout_ms, s.handler_for_id, s.dispatched_at,
              s.status_changed_at, s.rate_limits
), event AS (
    INSERT INTO runs_runevent
        (run_id, attempt_number, entity, entity_id, kind, from_status, to_status, actor,
         message, payload, created_at)
    SELECT run_id, attempt_number, 'step', id::text, 'transition', 'pending', 'running',
           %(worker)s, '', jsonb_build_object('attempt', attempts), now()
    FROM claimed
)
{select}
"""
_CLAIM_SELECT = """SELECT id, run_id, attempt_number, attempts, task_id, generation, name, tool,
       params, "when", timeout_ms, handler_for_id, dispatched_at, status_changed_at,
       rate_limits, {more} AS more
FROM claimed"""
_CLAIM_SQL = _CLAIM_TEMPLATE.format(
    before="", pick="", step="%(step)s", select=_CLAIM_SELECT.format(more="false")
)
# The next claimable step of a run, in plan order, skipping the rows another worker is
# claiming at this moment (a doorbell's claim: ``claim_next_step``). The partial index
# ``step_claimable`` holds exactly these rows.
_CLAIM_NEXT_PICK = {
    "pick": """next AS (
    SELECT id FROM runs_step
    WHERE run_id = %(run)s
      AND status = 'pending'
      AND dispatched_at IS NOT NULL
      AND (next_run_at IS NULL OR next_run_at <= now())
    -- The order of the partial index step_claimable (run, id): by id alone, a generic
    -- plan read the run's pending steps by another index and sorted them all.
    ORDER BY run_id, id
    LIMIT 1
    FOR NO KEY UPDATE SKIP LOCKED
), """,
    # The run too: probed by its key and id in step_claimable, where a generic plan made
    # for the id alone walked that index.
    "step": "(SELECT id FROM next) AND s.run_id = %(run)s",
    # Whether the run has another claimable step now (rows being claimed by others at
    # this moment included): the server that claimed this one may call for help
    # (``orchestrator.executor``). One probe of the same partial index.
    "more": """EXISTS (
        SELECT 1 FROM runs_step AS other
        WHERE other.run_id = %(run)s
          AND other.status = 'pending'
          AND other.dispatched_at IS NOT NULL
          AND (other.next_run_at IS NULL OR other.next_run_at <= now())
          AND other.id <> claimed.id
    )""",
}


def claim_next_sql(select: str, *, run: str = "%(run)s", before: str = "") -> str:
    """The statement of ``claim_next_step``, for a caller that claims inside a statement
    of its own (the hot path's function, ``fairness.next_run``): the run's id given by
    the expression ``run``, CTEs ``before`` it (ending with a comma), and ``select`` as
    the final SELECT over ``claimed`` (``{more}`` in it: whether the run has more
    claimable)."""
    return _CLAIM_TEMPLATE.format(
        before=before,
        pick=_CLAIM_NEXT_PICK["pick"].replace("%(run)s", run),
        step=_CLAIM_NEXT_PICK["step"].replace("%(run)s", run),
        select=select.format(more=_CLAIM_NEXT_PICK["more"].replace("%(run)s", run)),
    )


_CLAIM_NEXT_SQL = claim_next_sql(_CLAIM_SELECT)
# A claimed step's row as one JSON value (a caller whose final SELECT has other columns).
CLAIMED_JSON = "to_jsonb(claimed) || jsonb_build_object('more', {more})"


def claimed_from_json(value: Any) -> dict[str, Any]:
    """A claimed step's row given as ``CLAIMED_JSON``, as ``claim_next_step`` returns it."""
    row = json.loads(value) if isinstance(value, str) else dict(value)
    row["run_id"] = UUID(row["run_id"])
    for name in ("dispatched_at", "status_changed_at"):
        if row.get(name):
            row[name] = datetime.fromisoformat(row[name])
    return row


# What a step attempt needs to run, read in the same statement that claims it.
_CLAIMED_FIELDS = (
    "id",
    "run_id",
    "attempt_number",
    "attempts",
    "task_id",
    "generation",
    "name",
    "tool",
    "params",
    "when",
    "timeout_ms",
    "handler_for_id",
    # For the queue-wait metric (common.metrics): dispatched, then claimed.
    "dispatched_at",
    "status_changed_at",
    # The rate limits it spends ([] for most steps: runs.step_admission).
    "rate_limits",
    # A doorbell's claim: the run has more claimable steps (always false for claim_step).
    "more",
)


def claim_step(
    step_id: int, *, worker: str, task_id: str, lease_seconds: float
) -> dict[str, Any] | None:
    """PENDING -> RUNNING for one attempt of ``step_id``, with its lease and event, only if
    the step is pending, dispatched and due and its run is RUNNING; return the step's
    fields (``_CLAIMED_FIELDS``), or None when nothing was claimed (a duplicate or late
    message, a paused or cancelled run): a no-op."""
    return _claim(
        _CLAIM_SQL, {"step": step_id, "lease": lease_seconds, "worker": worker, "task_id": task_id}
    )


def claim_next_step(
    run_id: Any, *, worker: str, task_id: str, lease_seconds: float
) -> dict[str, Any] | None:
    """Claim the next claimable step of ``run_id`` (pending, dispatched, due, in plan
    order), as ``claim_step`` does; None when the run has none or is not RUNNING.

    Rows that another worker is claiming at the same moment are skipped, not waited
    for: two workers serving one run never queue behind each other's claim.
    """
    return _claim(
        _CLAIM_NEXT_SQL,
        {"run": run_id, "lease": lease_seconds, "worker": worker, "task_id": task_id},
    )


def _claim(sql: str, params: dict[str, Any]) -> dict[str, Any] | None:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    if row is None:
        return None
    values = dict(zip(_CLAIMED_FIELDS, row, strict=True))
    eventstreams.events_written(values["run_id"])  # the claim wrote the step's event
    for name in ("params", "rate_limits"):
        if isinstance(values[name], str):  # a driver that hands jsonb back as text
            values[name] = json.loads(values[name])
    return values
