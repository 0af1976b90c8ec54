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
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, TypeVar
from uuid import UUID

from django.db import connection, models, transaction
from django.db.models import F, Func, Value
from django.db.models.functions import Coalesce
from django.utils import timezone

from common import eventstreams
from runs.models import Agent, EventKind, Run, RunEvent, Step, Task
from runs.states import TERMINAL, InvalidTransition, check_transition, is_allowed

Entity = TypeVar("Entity", Run, Agent, Task, Step)
# Rows written by one UPDATE of transition_many (a run's widest task holds 5,000 steps).
UPDATE_BATCH = 5_000

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
        # Written by the database's one rule (runs/sql/duration_ms.sql); the
        # caller's copy reads it back when asked for (``_written_back``).
        obj.duration_ms = lasted(now)
        fields += ["completed_at", "duration_ms"]
    return fields


def lasted(now: Any, since: str = "started_at", created: str = "created_at") -> models.Expression:
    """How long a row's state lasted when it ends at ``now`` (a moment, or an expression
    of one), in whole milliseconds: runs.duration_ms of the row's columns ``since``
    (``created`` when that is unset) as they were before the UPDATE that writes it."""
    moment = now if isinstance(now, models.Expression) else Value(now)
    return Func(
        moment,
        F(since),
        F(created),
        function="runs.duration_ms",
        output_field=models.BigIntegerField(),
    )


def _written_back(obj: Run | Agent | Task | Step) -> None:
    """A field saved as an expression of the row (``lasted``) is read back from the
    row when the caller asks for it, as a deferred field is, never kept as the
    expression."""
    if isinstance(obj.__dict__.get("duration_ms"), models.Expression):
        del obj.__dict__["duration_ms"]


# What transition_many writes for a field _apply gave its rows different values: the
# rule that gave each row its own, as an expression of the row's columns before the
# UPDATE (set where unset).
def _per_row(name: str, now: datetime) -> models.Expression:
    if name in ("started_at", "picked_up_at"):
        return Coalesce(F(name), Value(now))
    raise ValueError(f"transition_many has no rule for {name!r} differing between rows")


def _written(
    locked: Sequence[Run | Agent | Task | Step], fields: set[str], now: datetime
) -> dict[str, Any]:
    """The columns one UPDATE of ``locked`` writes, after _apply and the updates set
    ``fields`` on each: a field's value where every row has the same (a state, a moment,
    an error), else its rule (``_per_row``); ``updated_at`` the moment, as ``save`` does."""
    written: dict[str, Any] = {}
    for name in sorted(fields):
        if name == "updated_at":
            for obj in locked:
                obj.updated_at = now  # type: ignore[union-attr]
            written[name] = now
            continue
        first = getattr(locked[0], name)
        if all(getattr(obj, name) == first for obj in locked[1:]):
            written[name] = first
        else:
            written[name] = _per_row(name, now)
    return written


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
# A run's gate (runs.run_gate, runs/sql/run_gate.sql): recordings of the run's
# steps take it shared, and so overlap; every other change of the run takes it
# exclusively first (``lock_gate``: services.lock_run, and transition() of a run).


def lock_gate(run_id: Any, *, shared: bool = False) -> None:
    """Close the run's gate for the rest of the transaction (``shared``: as a recording
    of its steps does, beside the others)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT runs.run_gate(%s, %s)", [run_id, shared])


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
    _written_back(obj)
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
        # One UPDATE per UPDATE_BATCH rows (bulk_update's CASE per row and field cost a
        # cancel of six steps 60 % of its time in compiling it).
        written = _written(locked, fields, now)
        for first in range(0, len(locked), UPDATE_BATCH):
            batch = [obj.pk for obj in locked[first : first + UPDATE_BATCH]]
            model.objects.filter(pk__in=batch).update(**written)
        for obj in locked:
            _written_back(obj)
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
# A worker's PENDING -> RUNNING is the hottest transition: one call of runs.step_claim
# (runs/sql/step_claim.sql) moves the step, writes its event and returns what the
# attempt needs, instead of transition()'s lock, read, save and insert. It is still this
# module's: the table must allow it.
if not is_allowed("step", "pending", "running"):
    raise RuntimeError("runs.states no longer allows step pending -> running; fix claim_step")

_CLAIM_SQL = "SELECT * FROM runs.step_claim(%s, %s, %s, %s, %s)"


def claimed_from_json(value: Any) -> dict[str, Any]:
    """A claimed step's row given as JSON (``to_jsonb`` of runs.step_claim's row, as
    runs.step_completed and runs.run_choose return it), as ``claim_step`` returns it."""
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
    # The rate limits it spends ([] for most steps: runs.admission.step_admission).
    "rate_limits",
    # Completed without running it: its reused output's source, its cache (runs.reuse).
    "reused_from",
    "cache",
    # The run has more claimable steps: its server may call for help.
    "more",
)


def claim_step(
    step_id: int, *, worker: str, task_id: str, lease_seconds: float
) -> dict[str, Any] | None:
    """PENDING -> RUNNING for one attempt of ``step_id``, with its lease and event, only if
    the step is pending, dispatched and due and its run is RUNNING; return the step's
    fields (``_CLAIMED_FIELDS``), or None when nothing was claimed (a duplicate or late
    message, a paused or cancelled run): a no-op."""
    return _claim([step_id, None, worker, task_id, lease_seconds])


def claim_next_step(
    run_id: Any, *, worker: str, task_id: str, lease_seconds: float
) -> dict[str, Any] | None:
    """Claim the next claimable step of ``run_id`` (pending, dispatched, due, in plan
    order), as ``claim_step`` does; None when the run has none or is not RUNNING.

    Rows that another worker is claiming at the same moment are skipped, not waited
    for: two workers serving one run never queue behind each other's claim.
    """
    return _claim([None, run_id, worker, task_id, lease_seconds])


def _claim(params: list[Any]) -> dict[str, Any] | None:
    with connection.cursor() as cursor:
        cursor.execute(_CLAIM_SQL, params)
        row = cursor.fetchone()
    if row is None:
        return None
    values = dict(zip(_CLAIMED_FIELDS, row, strict=True))
    eventstreams.events_written(values["run_id"])  # the claim wrote the step's event
    for name in ("params", "rate_limits", "reused_from", "cache"):
        if isinstance(values[name], str):  # a driver that hands jsonb back as text
            values[name] = json.loads(values[name])
    return values


# A batch's steps that will not start go back: running -> pending (-> paused in a paused
# run), by runs.steps_hand_back (runs/sql/steps_hand_back.sql).
if not (is_allowed("step", "running", "pending") and is_allowed("step", "pending", "paused")):
    raise RuntimeError("runs.states no longer allows a step's hand-back; fix hand_back_steps")

_HAND_BACK_SQL = "SELECT runs.steps_hand_back(%s, %s::bigint[], %s::integer[], %s)"


def hand_back_steps(run_id: Any, steps: Sequence[tuple[int, int]], *, actor: str) -> int:
    """Give back steps of ``run_id`` a worker claimed (``steps``: each with the attempt
    it was claimed for) and will not start: pending and claimable again, or paused in a
    paused run; a step no longer running that attempt is left as it is. Returns how many
    were made claimable (the caller rings for them)."""
    if not steps:
        return 0
    with connection.cursor() as cursor:
        cursor.execute(
            _HAND_BACK_SQL,
            [run_id, [step for step, _ in steps], [attempt for _, attempt in steps], actor],
        )
        claimable = int(cursor.fetchone()[0])
    eventstreams.events_written(run_id)
    return claimable
