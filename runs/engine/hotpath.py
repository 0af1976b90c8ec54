"""The hot path: the plainest step outcomes, each recorded in one SQL statement.

Most step outcomes are the plainest case: the attempt succeeded, the step is not an
on_error handler, and nothing above its agent changes. The general path
(``outcomes._record``) spends ten to twenty-five ORM statements on it: lock the step,
update it, insert its event, read and update the task's counters, release the
successors, pick and mark the steps that became ready, count them, and when the step was
its task's last, complete the task and do the same one level up. Here one SQL statement
does all of that, with data-modifying CTEs, and returns the steps it dispatched; no
model instance is built. Three statements cover the three shapes:

- ``_IN_TASK``: the task has other children open; it goes on;
- ``_LAST_IN_TASK``: the step was its task's last open child (a dag node is a one-step
  task): the task completes, and its agent, which has other children open, goes on;
- ``_LAST_IN_RUN``: the step was the run's last open work: its task, its agent and the
  run complete, the attempt closes and its reservation is settled (the charge drawn, the
  rest refunded).

A third statement, ``_START_SQL``, starts a run just picked up (``start``): its ready
agents, their ready tasks and those tasks' ready steps, as ``dispatch.dispatch_agents``
would.

Each changes exactly what the general path would (same columns, same events in the same
order, same counters, same choice of work to dispatch), and only when it is sure to:
the levels involved RUNNING, the run RUNNING with no approval waiting. Otherwise the
statement writes nothing and says so, and the caller takes the general path in the same
transaction. The caller holds the run's row lock, as on every engine path; that lock is
what makes the counters read here current (every writer of them holds it), and each
statement starts after the lock is granted, so its snapshot sees every earlier holder's
commit. ``tests/runs/engine/test_hotpath.py`` plays plans with the hot path on and off
and compares everything they leave behind.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from billing.services import CHARGE_CTES, SETTLE_CTES, charge_key, settle_reason, to_credits
from common.statements import Statement
from runs.models import Run
from runs.states import RunStatus, is_allowed

if not is_allowed("step", "running", "completed"):
    raise RuntimeError("runs.states no longer allows step running -> completed; fix the hot path")

# The parts both statements share: the step completed as transition_locked() would
# complete it, only if it is running this attempt and is no handler; the run's heartbeat;
# the event insert.
_PARTS = {
    "step_completed": """status = 'completed',
        status_changed_at = %(now)s,
        completed_at = %(now)s,
        duration_ms = GREATEST(0, floor(EXTRACT(EPOCH FROM
            (%(now)s::timestamptz - COALESCE(s.started_at, s.created_at))) * 1000))::bigint,
        output = %(output)s::jsonb,
        cost = s.cost + %(cost)s,
        lease_expires_at = NULL""",
    "step_running": """s.id = %(step)s AND s.task_id = task.id AND s.status = 'running'
      AND s.attempts = %(attempt)s AND s.handler_for_id IS NULL
    RETURNING s.id, s.run_id, s.attempt_number, s.attempts, s.name, s.dependents""",
    "beat": """beat AS (
    UPDATE runs_run SET last_heartbeat = %(now)s
    WHERE id = %(run)s AND %(beat)s AND EXISTS (SELECT 1 FROM done)""",
    # The step, read with its task: the same conditions as ``step_running``, so that the
    # charge (due only when the step will complete) and the update agree. The task's id
    # again as a value (an InitPlan), for the planner: joined on the step alone, a generic
    # plan made while the tables were small walked every task and probed each one's steps.
    "step_of_task": """s.id = %(step)s AND s.status = 'running' AND s.attempts = %(attempt)s
      AND s.handler_for_id IS NULL
      AND t.id = (SELECT task_id FROM runs_step WHERE id = %(step)s)""",
    # The attempt's charge (billing.services.CHARGE_CTES), as credits_charge() would
    # write it; the step completes only if the reservation paid it.
    "charge": """charge AS (
    SELECT %(charge_id)s::uuid AS id, %(organization)s::uuid AS organization_id,
           %(run)s::uuid AS run_id, task.step_attempt_number AS attempt_number,
           %(step)s::bigint AS step_id, %(amount)s::numeric AS amount,
           %(charge_key)s::text AS key,
           left('step ' || task.step_name || ' attempt ' || %(attempt)s::text, 500) AS reason,
           'engine'::text AS actor""",
    "charges": CHARGE_CTES,
    # The step's dependents in its task released, each found by a probe of the unique
    # (task, generation, name) index: a condition on the names alone let PostgreSQL, with
    # a table not yet analysed, walk every step of the table through the handler index.
    "step_released": """step_released AS (
    UPDATE runs_step AS st SET pending_dependencies = st.pending_dependencies - 1
    FROM (
        SELECT dependent.id
        FROM done, task, jsonb_array_elements_text(done.dependents) AS released (name),
        LATERAL (
            SELECT id FROM runs_step
            WHERE task_id = task.id AND generation = task.retry_count
              AND name = released.name AND handler_for_id IS NULL
            OFFSET 0
        ) AS dependent
    ) AS rel
    WHERE st.id = rel.id""",
    "settles": SETTLE_CTES,
    # A task or agent completed as transition_locked() completes it, with the child that
    # ended it counted off (child_done).
    "task_finished": """UPDATE runs_task AS t
    SET {node_completed}
    FROM done
    WHERE t.id = (SELECT id FROM task)
    RETURNING t.id, t.run_id, t.attempt_number""",
    "agent_finished": """UPDATE runs_agent AS t
    SET {node_completed}
    FROM done
    WHERE t.id = (SELECT id FROM agent)
    RETURNING t.id, t.run_id, t.attempt_number""",
    "node_completed": """status = 'completed',
        status_changed_at = %(now)s,
        completed_at = %(now)s,
        duration_ms = GREATEST(0, floor(EXTRACT(EPOCH FROM
            (%(now)s::timestamptz - COALESCE(t.started_at, t.created_at))) * 1000))::bigint,
        open_children = t.open_children - 1,
        active_children = t.active_children - 1""",
    "paid": "(NOT EXISTS (SELECT 1 FROM charge) OR EXISTS (SELECT 1 FROM charge_drawn))",
    "insert_event": """INSERT INTO runs_runevent
        (run_id, attempt_number, entity, entity_id, kind, from_status, to_status, actor,
         message, payload, created_at)""",
}

# Sub-statements of one statement share its snapshot and cannot see each other's writes:
# so a successor's dependency count is read as stored and the release applied in the
# same expression (``remaining``), and a successor that is both released and dispatched
# is updated once (``moved``). ``ready`` mirrors dispatch._DISPATCH_STEPS_SQL: the task's
# pending, undispatched steps with no dependency left, by position, up to the free slots.
_IN_TASK = """
WITH task AS (
    SELECT t.id, t.retry_count, t.max_concurrent_steps, t.active_children,
           s.attempt_number AS step_attempt_number, s.name AS step_name
    FROM runs_task AS t JOIN runs_step AS s ON s.task_id = t.id
    WHERE {step_of_task} AND t.status = 'running' AND t.open_children > 1
), {charge}
    FROM task WHERE %(amount)s::numeric > 0
), {charges}, done AS (
    UPDATE runs_step AS s
    SET {step_completed}
    FROM task
    WHERE {paid} AND {step_running}
), event AS (
    {insert_event}
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
    -- The ids as the one index condition, never a join: joined on ``siblings``
    -- (estimated at a hundred rows: a set-returning function's default) it scanned the
    -- whole step table while that was small, and a nested loop over the ids with the
    -- ids also as an index condition probed every id once per row (quadratic in a wide
    -- start: see _START). What a row needs of its sibling is a hashed subplan each.
    UPDATE runs_step AS st
    SET pending_dependencies = st.pending_dependencies
            - (st.id IN (SELECT id FROM siblings WHERE released))::int,
        dispatched_at = CASE WHEN st.id IN (SELECT id FROM ready) THEN %(now)s
                             ELSE st.dispatched_at END
    WHERE st.id = ANY (ARRAY(SELECT id FROM siblings
                             WHERE released OR id IN (SELECT id FROM ready)))
    RETURNING st.id, st.tool, st.timeout_ms, st.run_id, st.attempt_number, st.status,
              st.position, st.id IN (SELECT id FROM ready) AS dispatched
), counted AS (
    UPDATE runs_task AS t
    SET open_children = t.open_children - 1,
        active_children = t.active_children - 1 + (SELECT count(*) FROM ready)
    FROM done
    WHERE t.id = (SELECT id FROM task)
), {beat}
)
SELECT done.id,
       moved.id, moved.tool, moved.timeout_ms, moved.run_id, moved.attempt_number,
       moved.status
FROM done LEFT JOIN moved ON moved.dispatched
ORDER BY moved.position
"""

# The task's last child completed, so the task completes; its agent goes on. The same
# again one level up: the task's dependents released, the agent's ready tasks started
# (up to max_concurrent_tasks) and each started task's ready steps dispatched (up to its
# max_concurrent_steps, ``row_number`` per task). The events go in with one INSERT, in
# the general path's order (step, task, then the started tasks by id). A started task
# whose first ready step is an approval is left to the general path (``done`` finds
# nothing): there the run may stop to wait for it before the next task dispatches.
_LAST_IN_TASK = """
WITH task AS (
    SELECT t.id, t.agent_id, t.retry_count, t.dependents,
           s.attempt_number AS step_attempt_number, s.name AS step_name
    FROM runs_task AS t JOIN runs_step AS s ON s.task_id = t.id
    WHERE {step_of_task} AND t.status = 'running' AND t.open_children = 1
), agent AS (
    SELECT a.id, a.retry_count, a.active_children,
           GREATEST(a.max_concurrent_tasks - (a.active_children - 1), 0) AS free
    FROM runs_agent AS a, task
    WHERE a.id = task.agent_id AND a.status = 'running' AND a.open_children > 1
), released AS (
    SELECT jsonb_array_elements_text(task.dependents) AS name FROM task
), siblings AS (
    SELECT tk.id, tk.position, tk.status, tk.dispatched_at, tk.pending_dependencies AS pending,
           true AS released
    FROM released, agent, LATERAL (
        SELECT * FROM runs_task
        WHERE agent_id = agent.id AND generation = agent.retry_count AND name = released.name
        OFFSET 0  -- one unique-index probe per name
    ) AS tk
    UNION
    SELECT * FROM (
        SELECT tk.id, tk.position, tk.status, tk.dispatched_at,
               tk.pending_dependencies AS pending, false AS released
        FROM runs_task AS tk
        WHERE tk.agent_id = (SELECT id FROM agent)
          AND tk.generation = (SELECT retry_count FROM agent)
          AND tk.status = 'pending' AND tk.pending_dependencies = 0
          AND tk.dispatched_at IS NULL
        ORDER BY tk.position
        LIMIT (SELECT free FROM agent)
    ) AS held
), ready AS (
    SELECT id FROM siblings
    WHERE status = 'pending' AND dispatched_at IS NULL AND pending - released::int = 0
    ORDER BY position
    LIMIT (SELECT free FROM agent)
), new_steps AS (
    -- Each ready task's first steps, looked up by its id (an index condition the
    -- planner estimates well): joined on ``ready``, or given the ids as an array, a plan
    -- made under statistics that counted many steps pending read the whole step table
    -- (seen in a full test session).
    SELECT st.id, st.task_id, st.position, st.tool
    FROM ready
    JOIN runs_task AS tk ON tk.id = ready.id
    CROSS JOIN LATERAL (
        SELECT s.id, s.task_id, s.position, s.tool FROM runs_step AS s
        WHERE s.task_id = tk.id AND s.generation = tk.retry_count
          AND s.status = 'pending' AND s.pending_dependencies = 0
          AND s.dispatched_at IS NULL
        ORDER BY s.position
        LIMIT GREATEST(tk.max_concurrent_steps - tk.active_children, 0)
    ) AS st
), {charge}
    FROM task, agent
    WHERE %(amount)s::numeric > 0 AND NOT EXISTS (SELECT 1 FROM new_steps WHERE tool = 'approval')
), {charges}, done AS (
    UPDATE runs_step AS s
    SET {step_completed}
    FROM task, agent
    WHERE NOT EXISTS (SELECT 1 FROM new_steps WHERE tool = 'approval') AND {paid}
      AND {step_running}
), {step_released}
), finished AS (
    {task_finished}
), new_counts AS (
    SELECT task_id, count(*) AS n FROM new_steps GROUP BY task_id
), moved_tasks AS (
    -- The ids as the one index condition, as in _IN_TASK's ``moved``.
    UPDATE runs_task AS tk
    SET pending_dependencies = tk.pending_dependencies
            - (tk.id IN (SELECT id FROM siblings WHERE released))::int,
        status = CASE WHEN tk.id IN (SELECT id FROM ready) THEN 'running' ELSE tk.status END,
        status_changed_at = CASE WHEN tk.id IN (SELECT id FROM ready) THEN %(now)s
                                 ELSE tk.status_changed_at END,
        started_at = CASE WHEN tk.id IN (SELECT id FROM ready)
                          THEN COALESCE(tk.started_at, %(now)s) ELSE tk.started_at END,
        dispatched_at = CASE WHEN tk.id IN (SELECT id FROM ready) THEN %(now)s
                             ELSE tk.dispatched_at END,
        active_children = tk.active_children
            + COALESCE((SELECT n FROM new_counts WHERE new_counts.task_id = tk.id), 0)
    WHERE tk.id = ANY (ARRAY(SELECT id FROM siblings
                             WHERE released OR id IN (SELECT id FROM ready)))
      AND EXISTS (SELECT 1 FROM done)
    RETURNING tk.id, tk.run_id, tk.attempt_number, tk.position,
              tk.id IN (SELECT id FROM ready) AS started
), moved_steps AS (
    UPDATE runs_step AS st SET dispatched_at = %(now)s
    WHERE st.id = ANY (ARRAY(SELECT id FROM new_steps)) AND EXISTS (SELECT 1 FROM done)
    RETURNING st.id, st.tool, st.timeout_ms, st.run_id, st.attempt_number, st.status,
              st.task_id, st.position
), agent_counted AS (
    UPDATE runs_agent AS a
    SET open_children = a.open_children - 1,
        active_children = a.active_children - 1 + (SELECT count(*) FROM ready)
    FROM done
    WHERE a.id = (SELECT id FROM agent)
), event AS (
    {insert_event}
    SELECT run_id, attempt_number, entity, entity_id, 'transition', from_status, to_status,
           'system', '', payload, %(now)s
    FROM (
        SELECT 0 AS k, 0::bigint AS o, run_id, attempt_number, 'step' AS entity,
               id::text AS entity_id, 'running' AS from_status, 'completed' AS to_status,
               jsonb_build_object('cost', %(cost_text)s::text) AS payload
        FROM done
        UNION ALL
        SELECT 1, 0, run_id, attempt_number, 'task', id::text, 'running', 'completed',
               '{{}}'::jsonb
        FROM finished
        UNION ALL
        SELECT 2, id, run_id, attempt_number, 'task', id::text, 'pending', 'running',
               '{{}}'::jsonb
        FROM moved_tasks WHERE started
    ) AS e
    ORDER BY k, o
), {beat}
)
SELECT done.id,
       moved.id, moved.tool, moved.timeout_ms, moved.run_id, moved.attempt_number,
       moved.status
FROM done
LEFT JOIN (
    SELECT moved_steps.*, moved_tasks.position AS task_position
    FROM moved_steps JOIN moved_tasks ON moved_tasks.id = moved_steps.task_id
) AS moved ON true
ORDER BY moved.task_position, moved.position
"""

# The run's last open step: its task, its agent and the run complete, the attempt is
# closed, the step's charge drawn and the rest of the reservation refunded
# (billing.services.SETTLE_CTES), as ``services.run_complete`` would after the general
# path's propagation. Only when nothing else is open at any level, every other agent of
# the attempt completed or was skipped, and the reservation can pay the charge;
# otherwise nothing is written. The dependents a level releases are all finished
# already (they would be open otherwise), but their counts are released as the general
# path releases them. Events in the general path's order: step, task, agent, run, then
# the refund.
_LAST_IN_RUN = """
WITH task AS (
    SELECT t.id, t.agent_id, t.retry_count, t.dependents,
           s.attempt_number AS step_attempt_number, s.name AS step_name
    FROM runs_task AS t JOIN runs_step AS s ON s.task_id = t.id
    WHERE {step_of_task} AND t.status = 'running' AND t.open_children = 1
), agent AS (
    SELECT a.id, a.run_id, a.attempt_number, a.retry_count, a.dependents
    FROM runs_agent AS a, task
    WHERE a.id = task.agent_id AND a.status = 'running' AND a.open_children = 1
      AND NOT EXISTS (
          SELECT 1 FROM runs_agent AS other
          WHERE other.run_id = a.run_id AND other.attempt_number = a.attempt_number
            AND other.id <> a.id AND other.status NOT IN ('completed', 'skipped')
      )
), run AS (
    SELECT r.id FROM runs_run AS r, agent
    WHERE r.id = %(run)s AND r.id = agent.run_id AND r.status = 'running'
      AND r.open_children = 1 AND r.waiting_approvals = 0
), {charge}
    FROM task, run WHERE %(amount)s::numeric > 0
), settle AS (
    SELECT run.id AS run_id, agent.attempt_number, %(settle_reason)s::text AS reason,
           'engine'::text AS actor
    FROM run, agent
), {settles}, done AS (
    UPDATE runs_step AS s
    SET {step_completed}
    FROM task
    WHERE EXISTS (SELECT 1 FROM settle_drawn) AND {step_running}
), {step_released}
), finished AS (
    {task_finished}
), task_released AS (
    UPDATE runs_task AS tk SET pending_dependencies = tk.pending_dependencies - 1
    FROM agent
    WHERE tk.agent_id = agent.id AND tk.generation = agent.retry_count
      AND tk.name IN (SELECT jsonb_array_elements_text(task.dependents) FROM task)
      AND EXISTS (SELECT 1 FROM done)
), agent_finished AS (
    {agent_finished}
), agent_released AS (
    UPDATE runs_agent AS ag SET pending_dependencies = ag.pending_dependencies - 1
    FROM agent
    WHERE ag.run_id = agent.run_id AND ag.attempt_number = agent.attempt_number
      AND ag.name IN (SELECT jsonb_array_elements_text(agent.dependents) FROM agent)
      AND EXISTS (SELECT 1 FROM done)
), run_finished AS (
    UPDATE runs_run AS r
    SET status = 'completed',
        status_changed_at = %(now)s,
        completed_at = %(now)s,
        duration_ms = GREATEST(0, floor(EXTRACT(EPOCH FROM
            (%(now)s::timestamptz - COALESCE(r.started_at, r.created_at))) * 1000))::bigint,
        updated_at = %(now)s,
        open_children = r.open_children - 1,
        active_children = r.active_children - 1,
        last_heartbeat = CASE WHEN %(beat)s THEN %(now)s ELSE r.last_heartbeat END
    FROM done
    WHERE r.id = %(run)s
    RETURNING r.id, r.attempt_number
), attempt_finished AS (
    UPDATE runs_runattempt AS at SET finished_at = %(now)s, outcome = 'completed'
    FROM run_finished
    WHERE at.run_id = run_finished.id AND at.attempt_number = run_finished.attempt_number
), event AS (
    {insert_event}
    SELECT run_id, attempt_number, entity, entity_id, kind, from_status, to_status, actor,
           message, payload, %(now)s
    FROM (
        SELECT 0 AS k, run_id, attempt_number, 'step' AS entity, id::text AS entity_id,
               'transition' AS kind, 'running' AS from_status, 'completed' AS to_status,
               'system' AS actor, '' AS message,
               jsonb_build_object('cost', %(cost_text)s::text) AS payload
        FROM done
        UNION ALL
        SELECT 1, run_id, attempt_number, 'task', id::text, 'transition', 'running',
               'completed', 'system', '', '{{}}'::jsonb
        FROM finished
        UNION ALL
        SELECT 2, run_id, attempt_number, 'agent', id::text, 'transition', 'running',
               'completed', 'system', '', '{{}}'::jsonb
        FROM agent_finished
        UNION ALL
        SELECT 3, id, attempt_number, 'run', id::text, 'transition', 'running', 'completed',
               'engine', '', '{{}}'::jsonb
        FROM run_finished
        UNION ALL
        SELECT 4, run_finished.id, run_finished.attempt_number, 'run', run_finished.id::text,
               'charge', '', '', 'engine', 'refunded ' || refund.amount::text || ' credits',
               jsonb_build_object('type', 'refund', 'amount', refund.amount::text)
        FROM run_finished, settle_entry AS refund
    ) AS e
    ORDER BY k
)
SELECT done.id, NULL, NULL, NULL, NULL, NULL, NULL FROM done
"""

# The parts made of parts.
for _level in ("task_finished", "agent_finished"):
    _PARTS[_level] = _PARTS[_level].format(node_completed=_PARTS["node_completed"])
_IN_TASK_SQL = Statement(_IN_TASK.format(**_PARTS))
_LAST_IN_TASK_SQL = Statement(_LAST_IN_TASK.format(**_PARTS))
_LAST_IN_RUN_SQL = Statement(_LAST_IN_RUN.format(**_PARTS))


@dataclass(frozen=True)
class Completed:
    """What the statement did: the steps it dispatched, as the columns
    ``dispatch.step_from_row`` takes."""

    dispatched: list[dict[str, Any]]
    # The statement completed the run itself (its last step).
    run_finished: bool = False


def eligible(run: Run, error: object, skipped: bool, cost: Decimal) -> bool:
    """Whether the outcome may take the hot path at all (the statement checks the rest).
    A negative cost is left to the general path, where credits_charge refuses it."""
    return (
        error is None
        and not skipped
        and cost >= 0
        and run.status == RunStatus.RUNNING
        and run.waiting_approvals == 0
    )


def _params(
    run: Run, step_id: int, attempt: int, *, output: Any, cost: Decimal, now: datetime, beat: bool
) -> dict[str, Any]:
    """The parameters every shape takes."""
    return {
        "step": step_id,
        "attempt": attempt,
        "run": run.pk,
        "now": now,
        # None is SQL NULL, as the ORM stores it, not a JSON null.
        "output": None if output is None else json.dumps(output),
        "cost": cost,
        "cost_text": str(cost),
        "charge_id": uuid.uuid4(),
        "organization": run.organization_id,
        "amount": to_credits(cost),
        "charge_key": charge_key(step_id, attempt),
        "beat": beat,
        "settle_id": uuid.uuid4(),
        "settle_reason": settle_reason(run.pk, run.attempt_number),
    }


def complete(
    run: Run,
    step_id: int,
    attempt: int,
    *,
    output: Any,
    cost: Decimal,
    now: datetime,
    beat: bool,
    task_open: int | None,
    agent_open: int | None,
) -> Completed | None:
    """Complete ``step_id``'s ``attempt`` and advance its task in one statement; None when
    the step is not this plain case (or not running this attempt): nothing was written.

    ``task_open`` and ``agent_open`` (the open children of the step's task and agent, as
    read with the run's lock: ``services.lock_run_for_step``) choose which shape to try;
    each statement checks its own conditions, so a stale count costs a statement that
    writes nothing, never a wrong write. None: unknown, try."""
    params = _params(run, step_id, attempt, output=output, cost=cost, now=now, beat=beat)
    # Most steps have siblings still open; a one-step task (a dag node) ends with its
    # step; the last task of an agent is the general path's. A stale count (a sibling
    # finished while this waited for the lock) leaves the next shape to try, or the
    # general path: slower, never wrong.
    shapes = []
    if task_open is None or task_open > 1:
        shapes.append(_IN_TASK_SQL)
    if agent_open is None or agent_open > 1:
        shapes.append(_LAST_IN_TASK_SQL)
    elif run.open_children == 1 and task_open in (None, 1):
        shapes.append(_LAST_IN_RUN_SQL)
    rows: list[Any] = []
    for statement in shapes:
        rows = statement.rows(params)
        if rows:
            break
    if not rows:
        return None
    columns = ("id", "tool", "timeout_ms", "run_id", "attempt_number", "status")
    dispatched = [dict(zip(columns, row[1:], strict=True)) for row in rows if row[1] is not None]
    return Completed(dispatched, run_finished=statement is _LAST_IN_RUN_SQL)


# --------------------------------------------------------------------------- the start
# A run just picked up: its ready agents start (up to max_agents), each with its ready
# tasks (up to max_concurrent_tasks, ``row_number`` per agent), each of those with its
# ready steps dispatched (up to max_concurrent_steps, per task): what
# ``dispatch.dispatch_agents`` does with three ORM rounds per level, in one statement.
# The events go in with one INSERT in its order (an agent, then its tasks by id, agents
# by position). A ready step that is an approval is left to the general path (``go``
# finds nothing and nothing is written): there the run may stop to wait for it.
_START = """
WITH run AS (
    SELECT r.id, r.attempt_number, GREATEST(r.max_agents - r.active_children, 0) AS free
    FROM runs_run AS r
    WHERE r.id = %(run)s AND r.status = 'running'
), agents AS (
    SELECT a.id, a.position, a.retry_count,
           GREATEST(a.max_concurrent_tasks - a.active_children, 0) AS free
    FROM runs_agent AS a, run
    WHERE a.run_id = run.id AND a.attempt_number = run.attempt_number
      AND a.status = 'pending' AND a.pending_dependencies = 0 AND a.dispatched_at IS NULL
    ORDER BY a.position
    LIMIT (SELECT free FROM run)
), tasks AS (
    SELECT id, agent_id, position, retry_count, free FROM (
        SELECT t.id, t.agent_id, t.position, t.retry_count,
               GREATEST(t.max_concurrent_steps - t.active_children, 0) AS free,
               row_number() OVER (PARTITION BY t.agent_id ORDER BY t.position) AS n,
               ag.free AS agent_free
        FROM agents AS ag
        JOIN runs_task AS t ON t.agent_id = ag.id AND t.generation = ag.retry_count
        WHERE t.status = 'pending' AND t.pending_dependencies = 0 AND t.dispatched_at IS NULL
    ) AS numbered
    WHERE n <= agent_free
), steps AS (
    SELECT id, task_id, tool FROM (
        SELECT st.id, st.task_id, st.tool,
               row_number() OVER (PARTITION BY st.task_id ORDER BY st.position) AS n,
               tk.free
        FROM tasks AS tk
        JOIN runs_step AS st ON st.task_id = tk.id AND st.generation = tk.retry_count
        WHERE st.status = 'pending' AND st.pending_dependencies = 0
          AND st.dispatched_at IS NULL
    ) AS numbered
    WHERE n <= free
), go AS (
    SELECT 1 AS applied
    WHERE EXISTS (SELECT 1 FROM agents)
      AND NOT EXISTS (SELECT 1 FROM steps WHERE tool = 'approval')
), moved_agents AS (
    {start_agents}
    RETURNING n.id, n.run_id, n.attempt_number, n.position
), moved_tasks AS (
    {start_tasks}
    RETURNING n.id, n.run_id, n.attempt_number, n.agent_id, n.position
), moved_steps AS (
    -- The ids as the one index condition, never a join (as in _IN_TASK's ``moved``):
    -- joined on ``steps`` with the ids also as an index condition, a plan made while
    -- the tables were small probed all 20,000 ids of a wide fan-out once per step, and
    -- its pick-up did not end in a quarter of an hour (found by the noisy_neighbour
    -- bench).
    UPDATE runs_step AS st SET dispatched_at = %(now)s
    WHERE st.id = ANY (ARRAY(SELECT id FROM steps)) AND EXISTS (SELECT 1 FROM go)
    RETURNING st.id, st.tool, st.timeout_ms, st.run_id, st.attempt_number, st.status,
              st.task_id, st.position
), run_counted AS (
    UPDATE runs_run AS r
    SET active_children = r.active_children + (SELECT count(*) FROM agents)
    WHERE r.id = %(run)s AND EXISTS (SELECT 1 FROM go)
), event AS (
    INSERT INTO runs_runevent
        (run_id, attempt_number, entity, entity_id, kind, from_status, to_status, actor,
         message, payload, created_at)
    SELECT run_id, attempt_number, entity, entity_id, 'transition', 'pending', 'running',
           'system', '', '{{}}'::jsonb, %(now)s
    FROM (
        SELECT a.position AS p, 0 AS k, 0::bigint AS o, a.run_id, a.attempt_number,
               'agent' AS entity, a.id::text AS entity_id
        FROM moved_agents AS a
        UNION ALL
        SELECT a.position, 1, t.id, t.run_id, t.attempt_number, 'task', t.id::text
        FROM moved_tasks AS t JOIN moved_agents AS a ON a.id = t.agent_id
    ) AS e
    ORDER BY p, k, o
)
SELECT (SELECT count(*) FROM agents),
       moved.id, moved.tool, moved.timeout_ms, moved.run_id, moved.attempt_number,
       moved.status
FROM go
LEFT JOIN (
    SELECT s.*, t.position AS task_position, a.position AS agent_position
    FROM moved_steps AS s
    JOIN moved_tasks AS t ON t.id = s.task_id
    JOIN moved_agents AS a ON a.id = t.agent_id
) AS moved ON true
ORDER BY moved.agent_position, moved.task_position, moved.position
"""
# Agents and tasks start alike: RUNNING, dispatched, counting the children started with
# them (``{children}``, whose ``{parent}`` column names the node).
_START_NODES = """UPDATE {table} AS n
    SET status = 'running',
        status_changed_at = %(now)s,
        started_at = COALESCE(n.started_at, %(now)s),
        dispatched_at = %(now)s,
        active_children = n.active_children + COALESCE((
            SELECT count(*) FROM {children} WHERE {children}.{parent} = n.id), 0)
    WHERE n.id = ANY (ARRAY(SELECT id FROM {picked})) AND EXISTS (SELECT 1 FROM go)"""
_START_SQL = Statement(
    _START.format(
        start_agents=_START_NODES.format(
            table="runs_agent", children="tasks", parent="agent_id", picked="agents"
        ),
        start_tasks=_START_NODES.format(
            table="runs_task", children="steps", parent="task_id", picked="tasks"
        ),
    )
)


@dataclass(frozen=True)
class Started:
    """What ``start`` did: how many agents started, and the steps it dispatched."""

    agents: int
    dispatched: list[dict[str, Any]]


def start(run: Run, now: datetime) -> Started | None:
    """Start a run just picked up, in one statement (see ``_START_SQL``); None when it
    is not that plain case (nothing was written): the caller dispatches the general way.
    """
    rows = _START_SQL.rows({"run": run.pk, "now": now})
    if not rows:
        return None
    columns = ("id", "tool", "timeout_ms", "run_id", "attempt_number", "status")
    dispatched = [dict(zip(columns, row[1:], strict=True)) for row in rows if row[1] is not None]
    return Started(int(rows[0][0]), dispatched)
