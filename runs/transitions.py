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
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, TypeVar

from django.db import models, transaction
from django.utils import timezone

from runs.models import Agent, EventKind, Run, RunEvent, Step, Task
from runs.states import TERMINAL, check_transition, is_allowed

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
    with transaction.atomic():
        obj = model.objects.select_for_update(no_key=True).get(pk=pk)
        return transition_locked(
            obj, to_status, actor=actor, message=message, payload=payload, updates=updates, now=now
        )


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
    _event(
        obj, entity, from_status, to_status, actor=actor, message=message, payload=payload
    ).save()
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
    with transaction.atomic():
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
    return RunEvent.objects.create(
        run=run,
        attempt_number=run.attempt_number,
        entity=entity,
        entity_id=entity_id or str(run.pk),
        kind=kind,
        actor=actor,
        message=message,
        payload=dict(payload or {}),
    )
