"""Propagation: a child finished for good; its parent counts it, releases its dependents,
and finishes when it was the last, which a level up is the same again.

The rule is the database's (``runs.child_done``, runs/sql/child_done.sql), the
same functions the hot path's recordings are made of: here it is called after the
child's own transition, its dispatched steps announced and the run completed when the
propagation reached it with nothing left open."""

from __future__ import annotations

from django.db import DatabaseError, connection
from django.utils import timezone

from common import eventstreams
from runs import services
from runs.engine.dispatch import DISPATCHED, announce, step_from_row, update_waiting_state
from runs.models import Agent, Run, Step, Task
from runs.outbox import Outbox
from runs.states import InvalidTransition, RunStatus

_CHILD_DONE_SQL = "SELECT * FROM runs.child_done(%s, %s, %s)"
_REFUSED = "OEI01"  # runs.node_finish's SQLSTATE
_ENTITIES: dict[type[Agent | Task | Step], str] = {Agent: "agent", Task: "task", Step: "step"}


def finish_if_done(run: Run) -> None:
    """Complete the run once no agent is open (a plan can finish at pick-up: all skipped)."""
    if run.status == RunStatus.RUNNING and run.open_children == 0:
        services.run_complete(run_id=run.pk, actor="engine")


def child_done(run: Run, child: Agent | Task | Step, outbox: Outbox) -> None:
    """``child`` is finished for good (its transition made, a step's failure marked
    handled): its parent counts it and goes on, finishes, or (an on_error handler's
    task) leaves the step it handled to the caller."""
    now = timezone.now()
    try:
        with connection.cursor() as cursor:
            cursor.execute(_CHILD_DONE_SQL, [_ENTITIES[type(child)], child.pk, now])
            rows = cursor.fetchall()
    except DatabaseError as exc:
        # A parent the transition table does not let finish (runs.node_finish): the
        # refusal runs.transitions raises, for the caller's savepoint to undo.
        if getattr(exc.__cause__, "sqlstate", None) != _REFUSED:
            raise
        entity, from_state, to_state = exc.__cause__.diag.message_detail.split(" ")  # type: ignore[union-attr]
        raise InvalidTransition(entity, from_state, to_state) from exc
    eventstreams.events_written(run.pk)  # the function's events bypass runs.transitions
    ready = [step_from_row(dict(zip(DISPATCHED, row[1:], strict=True))) for row in rows[:-1]]
    announce(run, ready, outbox)
    ended = rows[-1][-1]
    if ended == "task":
        update_waiting_state(run)  # a task's step may have been what the run waited on
    elif ended == "run":
        run.refresh_from_db(fields=["open_children", "active_children", "status"])
        finish_if_done(run)
