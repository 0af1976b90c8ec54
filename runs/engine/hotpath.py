"""The hot path: a step that completed, in a task that goes on, recorded in one statement.

Most step outcomes are the plainest case: the attempt succeeded, the step is not an
on_error handler, and its task has other children still open, so nothing above the task
changes. The general path (``outcomes._record``) spends about ten ORM statements on it:
lock the step, update it, insert its event, read and update the task's counters,
release the successors, pick and mark the steps that became ready, count them. Here one
SQL statement does all of that, with data-modifying CTEs, and returns the steps it
dispatched; no model instance is built.

It changes exactly what the general path would (same columns, same event, same
counters, same choice of steps to dispatch), and only when it is sure to: the task must
be RUNNING with more than this child open, the run RUNNING with no approval waiting.
Otherwise the statement writes nothing and says so, and the caller takes the general
path in the same transaction. The caller holds the run's row lock, as on every engine
path; that lock is what makes the counters read here current (every writer of a task's
counters holds it), and the statement starts after the lock is granted, so its snapshot
sees every earlier holder's commit.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.db import connection

from runs.models import Run
from runs.states import RunStatus, is_allowed

if not is_allowed("step", "running", "completed"):
    raise RuntimeError("runs.states no longer allows step running -> completed; fix the hot path")

# Sub-statements of one statement share its snapshot and cannot see each other's writes:
# so a successor's dependency count is read as stored and the release applied in the
# same expression (``remaining``), and a successor that is both released and dispatched
# is updated once (``moved``). ``ready`` mirrors dispatch._DISPATCH_STEPS_SQL: the task's
# pending, undispatched steps with no dependency left, by position, up to the free slots.
_COMPLETE_SQL = """
WITH task AS (
    SELECT t.id, t.retry_count, t.max_concurrent_steps, t.active_children
    FROM runs_task AS t JOIN runs_step AS s ON s.task_id = t.id
    WHERE s.id = %(step)s AND t.status = 'running' AND t.open_children > 1
), done AS (
    UPDATE runs_step AS s
    SET status = 'completed',
        status_changed_at = %(now)s,
        completed_at = %(now)s,
        duration_ms = GREATEST(0, floor(EXTRACT(EPOCH FROM
            (%(now)s::timestamptz - COALESCE(s.started_at, s.created_at))) * 1000))::bigint,
        output = %(output)s::jsonb,
        cost = s.cost + %(cost)s,
        lease_expires_at = NULL
    FROM task
    WHERE s.id = %(step)s AND s.task_id = task.id AND s.status = 'running'
      AND s.attempts = %(attempt)s AND s.handler_for_id IS NULL
    RETURNING s.id, s.run_id, s.attempt_number, s.attempts, s.name, s.dependents
), event AS (
    INSERT INTO runs_runevent
        (run_id, attempt_number, entity, entity_id, kind, from_status, to_status, actor,
         message, payload, created_at)
    SELECT run_id, attempt_number, 'step', id::text, 'transition', 'running', 'completed',
           'system', '', jsonb_build_object('cost', %(cost_text)s::text), %(now)s
    FROM done
), released AS (
    SELECT jsonb_array_elements_text(done.dependents) AS name FROM done
), siblings AS (
    -- The successors this step releases (by name: the unique index of a task's steps)...
    SELECT st.id, st.position, st.status, st.dispatched_at, st.pending_dependencies AS pending,
           st.handler_for_id IS NULL AS released
    FROM released, task, LATERAL (
        SELECT * FROM runs_step
        WHERE task_id = task.id AND generation = task.retry_count AND name = released.name
        OFFSET 0  -- not flattened: one unique-index probe per name, whatever the estimates
    ) AS st
    UNION
    -- ...and the steps already ready but held by the concurrency limit, first ones first
    -- (the partial index step_ready covers exactly these rows, so a wide task costs what
    -- a narrow one does).
    SELECT * FROM (
        SELECT st.id, st.position, st.status, st.dispatched_at,
               st.pending_dependencies AS pending, false AS released
        FROM runs_step AS st
        WHERE st.task_id = (SELECT id FROM task)
          AND st.generation = (SELECT retry_count FROM task)
          AND st.status = 'pending' AND st.pending_dependencies = 0
          AND st.dispatched_at IS NULL
        ORDER BY st.position
        LIMIT (SELECT GREATEST(max_concurrent_steps - (active_children - 1), 0) FROM task)
    ) AS held
), ready AS (
    SELECT id FROM siblings
    WHERE status = 'pending' AND dispatched_at IS NULL
      AND pending - released::int = 0
    ORDER BY position
    LIMIT (SELECT GREATEST(max_concurrent_steps - (active_children - 1), 0) FROM task)
), moved AS (
    UPDATE runs_step AS st
    SET pending_dependencies = st.pending_dependencies - sib.released::int,
        dispatched_at = CASE WHEN sib.id IN (SELECT id FROM ready) THEN %(now)s
                             ELSE st.dispatched_at END
    FROM siblings AS sib
    WHERE st.id = sib.id AND (sib.released OR sib.id IN (SELECT id FROM ready))
    RETURNING st.id, st.tool, st.timeout_ms, st.run_id, st.attempt_number, st.status,
              st.position, sib.id IN (SELECT id FROM ready) AS dispatched
), counted AS (
    UPDATE runs_task AS t
    SET open_children = t.open_children - 1,
        active_children = t.active_children - 1 + (SELECT count(*) FROM ready)
    FROM done
    WHERE t.id = (SELECT id FROM task)
), beat AS (
    UPDATE runs_run SET last_heartbeat = %(now)s
    WHERE id = %(run)s AND %(beat)s AND EXISTS (SELECT 1 FROM done)
)
SELECT done.name, done.attempt_number, done.attempts,
       moved.id, moved.tool, moved.timeout_ms, moved.run_id, moved.attempt_number,
       moved.status
FROM done LEFT JOIN moved ON moved.dispatched
ORDER BY moved.position
"""


@dataclass(frozen=True)
class Completed:
    """What the statement did: the step it completed, and the steps it dispatched (as
    the columns ``dispatch.step_from_row`` takes)."""

    name: str
    attempt_number: int
    attempts: int
    dispatched: list[dict[str, Any]]


def eligible(run: Run, error: object, skipped: bool) -> bool:
    """Whether the outcome may take the hot path at all (the statement checks the rest)."""
    return (
        error is None
        and not skipped
        and run.status == RunStatus.RUNNING
        and run.waiting_approvals == 0
    )


def complete(
    run: Run,
    step_id: int,
    attempt: int,
    *,
    output: Any,
    cost: Decimal,
    now: datetime,
    beat: bool,
) -> Completed | None:
    """Complete ``step_id``'s ``attempt`` and advance its task in one statement; None when
    the step is not this plain case (or not running this attempt): nothing was written."""
    with connection.cursor() as cursor:
        cursor.execute(
            _COMPLETE_SQL,
            {
                "step": step_id,
                "attempt": attempt,
                "run": run.pk,
                "now": now,
                # None is SQL NULL, as the ORM stores it, not a JSON null.
                "output": None if output is None else json.dumps(output),
                "cost": cost,
                "cost_text": str(cost),
                "beat": beat,
            },
        )
        rows = cursor.fetchall()
    if not rows:
        return None
    name, attempt_number, attempts = rows[0][:3]
    columns = ("id", "tool", "timeout_ms", "run_id", "attempt_number", "status")
    dispatched = [dict(zip(columns, row[3:], strict=True)) for row in rows if row[3] is not None]
    return Completed(name, attempt_number, attempts, dispatched)
