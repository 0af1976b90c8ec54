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

import dataclasses
import json
import re
import uuid
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from billing.services import CHARGE_CTES, SETTLE_CTES, charge_key, settle_reason, to_credits
from common.statements import Statement
from runs.fairness import CHOICE_SQL, Choice
from runs.models import Run
from runs.states import is_allowed
from runs.transitions import CLAIMED_JSON, GATE_NAMESPACE, claim_next_sql, claimed_from_json

if not is_allowed("step", "running", "completed"):
    raise RuntimeError("runs.states no longer allows step running -> completed; fix the hot path")

# The parts both statements share: the step completed as transition_locked() would
# complete it, only if it is running this attempt and is no handler; the event insert.
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
           s.attempt_number AS step_attempt_number, s.name AS step_name,
           s.dependents AS step_dependents
    FROM runs_task AS t JOIN runs_step AS s ON s.task_id = t.id
    WHERE {step_of_task} AND t.status = 'running' AND t.open_children > 1
), released AS (
    -- Read with the task: what the step releases decides what is dispatched, and an
    -- approval among that is the general path's (there the run may stop to wait for
    -- it), so the charge and the step's completion depend on it.
    SELECT jsonb_array_elements_text(task.step_dependents) AS name FROM task
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
), plain AS (
    SELECT 1 AS ok WHERE NOT EXISTS (
        SELECT 1 FROM runs_step WHERE id IN (SELECT id FROM ready) AND tool = 'approval'
    )
), {charge}
    FROM task WHERE %(amount)s::numeric > 0 AND EXISTS (SELECT 1 FROM plain)
), {charges}, done AS (
    UPDATE runs_step AS s
    SET {step_completed}
    FROM task
    WHERE EXISTS (SELECT 1 FROM plain) AND {paid} AND {step_running}
), event AS (
    {insert_event}
    SELECT run_id, attempt_number, 'step', id::text, 'transition', 'running', 'completed',
           'system', '', jsonb_build_object('cost', %(cost_text)s::text), %(now)s
    FROM done
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
      AND EXISTS (SELECT 1 FROM done)
    RETURNING st.id, st.tool, st.timeout_ms, st.run_id, st.attempt_number, st.status,
              st.position, st.id IN (SELECT id FROM ready) AS dispatched
), counted AS (
    UPDATE runs_task AS t
    SET open_children = t.open_children - 1,
        active_children = t.active_children - 1 + (SELECT count(*) FROM ready)
    FROM done
    WHERE t.id = (SELECT id FROM task)
)
SELECT 'in_task'::text, %(priority)s::smallint, done.id,
       moved.id, moved.tool, moved.timeout_ms, moved.run_id, moved.attempt_number,
       moved.status, NULL::jsonb
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
)
SELECT 'last_in_task'::text, %(priority)s::smallint, done.id,
       moved.id, moved.tool, moved.timeout_ms, moved.run_id, moved.attempt_number,
       moved.status, NULL::jsonb
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
SELECT 'last_in_run'::text, %(priority)s::smallint, done.id,
       NULL::bigint, NULL::varchar, NULL::bigint, NULL::uuid, NULL::smallint, NULL::varchar,
       NULL::jsonb
FROM done
"""

# The parts made of parts.
for _level in ("task_finished", "agent_finished"):
    _PARTS[_level] = _PARTS[_level].format(node_completed=_PARTS["node_completed"])
# A leaf of a task whose steps all run at once: the step has no dependents, and the
# task's limit is at least its step count, so no sibling waits for a slot (every step
# was dispatched when the task started). Its completion releases and dispatches nothing:
# only the task's two counters change. So the function records it, and claims the
# worker's next step, before it locks the task's row, and takes that lock last, for the
# counters and the charge alone (docs/engine.md, "A wide task's leaves"): the
# recordings of a fan-out's leaves overlap instead of queueing behind one row for their
# whole statement. ``{into}`` is where the function reads the result into a variable.
_LEAF = """
WITH task AS (
    SELECT t.id
    FROM runs_task AS t JOIN runs_step AS s ON s.task_id = t.id
    WHERE {step_of_task} AND t.status = 'running' AND t.open_children > 1
      AND s.dependents = '[]'::jsonb AND t.max_concurrent_steps >= t.step_count
), done AS (
    UPDATE runs_step AS s
    SET {step_completed}
    FROM task
    WHERE {step_running}
), event AS (
    {insert_event}
    SELECT run_id, attempt_number, 'step', id::text, 'transition', 'running', 'completed',
           'system', '', jsonb_build_object('cost', %(cost_text)s::text), %(now)s
    FROM done
)
SELECT done.id {{into}}FROM done
"""
# The leaf's charge, after its task's counters (the order of every other recording:
# the task's row, then the reservation's), as ``_IN_TASK``'s ``charge`` writes it.
_LEAF_CHARGE = """
WITH task AS (
    SELECT s.attempt_number AS step_attempt_number, s.name AS step_name
    FROM runs_step AS s WHERE s.id = %(step)s
), {charge}
    FROM task WHERE %(amount)s::numeric > 0
), {charges}
SELECT count(*) {{into}}FROM charge_drawn
"""
_LEAF_SQL = Statement(_LEAF.format(**_PARTS).format(into=""))
_LEAF_CHARGE_SQL = Statement(_LEAF_CHARGE.format(**_PARTS).format(into=""))
_IN_TASK_SQL = Statement(_IN_TASK.format(**_PARTS))
_LAST_IN_TASK_SQL = Statement(_LAST_IN_TASK.format(**_PARTS))
_LAST_IN_RUN_SQL = Statement(_LAST_IN_RUN.format(**_PARTS))


# --------------------------------------------------------------------------- the function
# The recording runs inside PostgreSQL, as one function call in its own transaction: the
# run's lock, the choice of shape from the counts read under it, the shape's statement
# and the commit, with no round trip to the worker while the lock is held. Held across
# round trips (lock, statement, commit: three), the lock's holder was often waiting for
# a CPU between them: with 32 worker processes on two cores, the recordings of one run
# queued 60 ms each for a lock whose statements took 1 ms (docs/engine.md).
#
# The function is generated from the statements above (``function_sql``): ``%(name)s``
# becomes the PL/pgSQL variable ``a_name``. Its definition is frozen in a migration;
# ``tests/runs/engine/test_hotpath_function.py`` fails when the statements change
# without a migration that defines the function anew (``manage.py engine_function``
# prints the definition to put in one).
FUNCTION_NAME = "engine_step_completed"
_FUNCTION_BODY = """
DECLARE
    a_organization uuid;
    a_priority smallint;
    a_charge_id uuid := gen_random_uuid();
    a_settle_id uuid := gen_random_uuid();
    a_charge_key text := 'charge:' || a_step || ':' || a_attempt;
    a_settle_reason text;
    a_beat boolean;
    a_now timestamptz;
    v_status text;
    v_waiting integer;
    v_attempt integer;
    v_heartbeat timestamptz;
    v_task bigint;
    v_agent bigint;
    v_open integer;
    v_claim_run uuid;
    v_chosen uuid;
    v_chosen_org uuid;
    v_chosen_priority smallint;
    v_chosen_pickup boolean;
    v_chosen_busy bigint;
    v_recorded boolean := false;
    v_locking timestamptz;
    v_leaf boolean;
    v_done bigint;
    v_claimed jsonb;
    v_drawn bigint;
    v_locked timestamptz;
BEGIN
    -- The run's gate, shared: other recordings of the run go on beside this one;
    -- anything else that changes the run holds it exclusively (runs.transitions).
    PERFORM pg_advisory_xact_lock_shared({gate}, hashtext(a_run::text));
    SELECT r.status, r.waiting_approvals, r.organization_id, r.attempt_number,
           r.last_heartbeat, r.priority
      INTO v_status, v_waiting, a_organization, v_attempt, v_heartbeat, a_priority
      FROM runs_run AS r WHERE r.id = a_run;
    IF NOT FOUND OR v_status <> 'running' OR v_waiting > 0 THEN
        RETURN;
    END IF;
    -- The step, running this attempt (only an exclusive holder of the gate changes a
    -- running step, and none is in), and no on_error handler; whether it is a leaf of a
    -- task whose steps all run at once (_LEAF). Its row is locked first, before any
    -- other: a claim may hold it (a lock that outlived the claim's recheck), and such a
    -- claim may be waiting for a task's row; so no recording waits for its own step
    -- while it holds one.
    SELECT s.task_id, t.agent_id,
           s.dependents = '[]'::jsonb AND t.max_concurrent_steps >= t.step_count
           AND t.open_children > 1
      INTO v_task, v_agent, v_leaf
      FROM runs_step AS s JOIN runs_task AS t ON t.id = s.task_id
     WHERE s.id = a_step AND s.run_id = a_run AND s.status = 'running'
       AND s.attempts = a_attempt AND s.handler_for_id IS NULL
       FOR NO KEY UPDATE OF s;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    -- The worker's fair choice, when its slice is over (runs.scheduling), made before
    -- any row lock is taken and returned whatever it is: the run whose next step is
    -- claimed below, when it is of the worker's slot's organization and running; none
    -- when it is another organization's or a pick-up (the worker goes there); this
    -- run's when nothing was ready (what the recording makes ready may be).
    IF a_claim THEN
        v_claim_run := a_run;
        IF a_choose THEN
            SELECT c.org, c.id, c.priority, c.pickup, c.busy
              INTO v_chosen_org, v_chosen, v_chosen_priority, v_chosen_pickup, v_chosen_busy
              FROM ({choose}) AS c;
            RETURN QUERY SELECT 'chosen'::text, v_chosen_priority, NULL::bigint,
                NULL::bigint, NULL::varchar, NULL::bigint, v_chosen, NULL::smallint,
                NULL::varchar,
                jsonb_build_object('organization_id', v_chosen_org, 'pickup', v_chosen_pickup,
                                   'busy', v_chosen_busy);
            IF v_chosen IS NULL THEN
                v_claim_run := a_run;
            ELSIF v_chosen_pickup OR v_chosen_org IS DISTINCT FROM a_held THEN
                v_claim_run := NULL;
            ELSE
                v_claim_run := v_chosen;
            END IF;
        END IF;
    END IF;
    a_settle_reason := 'settled run ' || a_run || ' attempt ' || v_attempt;
    -- A leaf (_LEAF): the step completed and the next one claimed first, then the task's
    -- row locked for its counters alone, then the charge. The task's last leaf finds one
    -- child open there: the block is rolled back, its writes and row locks with it, and
    -- the shapes below record the step; so is a charge the reservation cannot pay.
    IF v_leaf THEN
        a_now := clock_timestamp();
        BEGIN
            {leaf};
            IF v_done IS NOT NULL THEN
                IF v_claim_run IS NOT NULL THEN
                    {leaf_claim};
                END IF;
                v_locking := clock_timestamp();
                UPDATE runs_task
                   SET open_children = open_children - 1, active_children = active_children - 1
                 WHERE id = v_task AND status = 'running' AND open_children > 1;
                IF NOT FOUND THEN
                    RAISE EXCEPTION USING ERRCODE = 'OEL01';
                END IF;
                v_locked := clock_timestamp();
                IF a_amount > 0 THEN
                    {leaf_charge};
                    IF v_drawn = 0 THEN
                        RAISE EXCEPTION USING ERRCODE = 'OEL01';
                    END IF;
                END IF;
            END IF;
        EXCEPTION WHEN SQLSTATE 'OEL01' THEN
            v_done := NULL;
            v_claimed := NULL;
        END;
        IF v_done IS NOT NULL THEN
            RETURN QUERY SELECT 'in_task'::text, a_priority, v_done, NULL::bigint,
                NULL::varchar, NULL::bigint, NULL::uuid, NULL::smallint, NULL::varchar,
                NULL::jsonb;
            IF v_claimed IS NOT NULL THEN
                RETURN QUERY SELECT 'claimed'::text, NULL::smallint, NULL::bigint,
                    NULL::bigint, NULL::varchar, NULL::bigint, NULL::uuid, NULL::smallint,
                    NULL::varchar,
                    v_claimed || jsonb_build_object('waited',
                                                    EXTRACT(EPOCH FROM v_locked - v_locking));
            END IF;
            IF a_now - COALESCE(v_heartbeat, a_now) > interval '5 seconds' THEN
                UPDATE runs_run SET last_heartbeat = a_now WHERE id = a_run;
            END IF;
            RETURN;
        END IF;
    END IF;
    -- Each level's row locked before its counts are read and its statement runs (the
    -- statement's snapshot then sees every earlier holder's commit): the task's, for
    -- its counters and its steps' dependencies; the agent's when the task ends, for its
    -- counters and its tasks'; the run's when the agent ends. Always in that order.
    v_locking := clock_timestamp();  -- the wait for the locks goes back to the worker
    SELECT open_children INTO v_open FROM runs_task WHERE id = v_task FOR NO KEY UPDATE;
    IF v_open > 1 THEN
        a_now := clock_timestamp();  -- as the general path's, once its locks are held
        RETURN QUERY {in_task};
        v_recorded := FOUND;
    ELSE
        SELECT open_children INTO v_open FROM runs_agent WHERE id = v_agent
           FOR NO KEY UPDATE;
        IF v_open > 1 THEN
            a_now := clock_timestamp();  -- as the general path's, once its locks are held
            RETURN QUERY {last_in_task};
            v_recorded := FOUND;
        ELSE
            SELECT open_children INTO v_open FROM runs_run WHERE id = a_run
               FOR NO KEY UPDATE;
            IF v_open = 1 THEN
                a_now := clock_timestamp();  -- as the general path's, once its locks are held
                a_beat := a_now - COALESCE(v_heartbeat, a_now) > interval '5 seconds';
                RETURN QUERY {last_in_run};
                RETURN;  -- the run's row is updated there, heartbeat included
            END IF;
        END IF;
    END IF;
    IF NOT v_recorded THEN
        RETURN;
    END IF;
    -- The worker's next step, claimed in the same commit, after the recording (what it
    -- made ready may be that step: the next of a sequence, a dag's next node) and under
    -- the recording's row locks: claiming takes a row lock that may outlive a row its
    -- recheck turned down (a step another worker's claim has just taken), and a claim
    -- made before the task's lock was taken held such a step while its own worker,
    -- recording it, waited behind that lock: a deadlock.
    IF v_claim_run IS NOT NULL THEN
        RETURN QUERY {claim};
    END IF;
    -- The run's heartbeat (when due: outcomes._beat_due), last: its row is locked only
    -- from here to the commit.
    IF a_now - COALESCE(v_heartbeat, a_now) > interval '5 seconds' THEN
        UPDATE runs_run SET last_heartbeat = a_now WHERE id = a_run;
    END IF;
END
"""
# The variables the statements' placeholders become: the function's arguments, or what
# it sets above.
_ARGUMENTS = (
    ("step", "bigint"),
    ("attempt", "integer"),
    ("run", "uuid"),
    ("output", "text"),
    ("cost", "numeric"),
    ("cost_text", "text"),
    ("amount", "numeric"),
    # The next step claimed for the worker (``claim``), as claim_next_step claims it.
    ("claim", "boolean"),
    ("worker", "text"),
    ("task_id", "text"),
    ("lease", "float8"),
    # The worker's fair choice, made first (``choose``), as fairness.next_run makes it.
    ("choose", "boolean"),
    ("me", "text"),
    ("full", "uuid[]"),
    ("skip", "uuid[]"),
    ("held", "uuid"),
)
_RESULT = (
    "o_shape text, o_priority smallint, o_done bigint, o_id bigint, o_tool varchar, "
    "o_timeout_ms bigint, o_run_id uuid, o_attempt_number smallint, o_status varchar, "
    "o_claimed jsonb"
)
# The claimed step's row, as one JSON value in the function's last column.
# With the seconds the recording waited for its locks (``waited``): how crowded the run's
# recordings are (orchestrator.executor: a server that waits more than it works leaves).
_CLAIMED_ROW = """SELECT 'claimed'::text, NULL::smallint, NULL::bigint, NULL::bigint,
       NULL::varchar, NULL::bigint, NULL::uuid, NULL::smallint, NULL::varchar,
       {claimed} || jsonb_build_object('waited', EXTRACT(EPOCH FROM a_now - v_locking))
FROM claimed"""


# The leaf's claim, read into a variable: its row is returned after the task's lock,
# with the time the recording waited for it.
_CLAIMED_INTO = "SELECT {claimed} INTO v_claimed FROM claimed"


def _as_plpgsql(statement: Statement) -> str:
    return _as_plpgsql_text(statement.text)


def _as_plpgsql_text(text: str) -> str:
    """A statement's text with each ``%(name)s`` as the variable ``a_name``."""
    return re.sub(r"%\((\w+)\)s", r"a_\1", text.strip())


def function_body() -> str:
    """The PL/pgSQL body of ``engine_step_completed``, from the statements above."""
    return _FUNCTION_BODY.format(
        gate=GATE_NAMESPACE,
        # The claim's clock is the recording's (now() would be the transaction's start,
        # before any wait for a lock): the step claimed starts as the last one ends.
        claim=_as_plpgsql_text(
            claim_next_sql(_CLAIMED_ROW.replace("{claimed}", CLAIMED_JSON), run="v_claim_run")
        ).replace("now()", "a_now"),
        choose=_as_plpgsql_text(CHOICE_SQL),
        leaf=_as_plpgsql_text(_LEAF.format(**_PARTS).format(into="INTO v_done ")),
        leaf_claim=_as_plpgsql_text(
            claim_next_sql(_CLAIMED_INTO.replace("{claimed}", CLAIMED_JSON), run="v_claim_run")
        ).replace("now()", "a_now"),
        leaf_charge=_as_plpgsql_text(_LEAF_CHARGE.format(**_PARTS).format(into="INTO v_drawn ")),
        in_task=_as_plpgsql(_IN_TASK_SQL),
        last_in_task=_as_plpgsql(_LAST_IN_TASK_SQL),
        last_in_run=_as_plpgsql(_LAST_IN_RUN_SQL),
    )


def function_sql() -> list[str]:
    """The statements that define ``engine_step_completed`` anew (for a migration)."""
    arguments = ", ".join(f"a_{name} {kind}" for name, kind in _ARGUMENTS)
    return [
        f"DROP FUNCTION IF EXISTS {FUNCTION_NAME}",
        f"CREATE FUNCTION {FUNCTION_NAME}({arguments})\n"
        f"RETURNS TABLE ({_RESULT})\n"
        f"LANGUAGE plpgsql VOLATILE AS $engine${function_body()}$engine$",
    ]


_CALL = Statement(
    f"SELECT * FROM {FUNCTION_NAME}("  # noqa: S608 - names of this module, no input
    + ", ".join(f"%({name})s::{kind}" for name, kind in _ARGUMENTS)
    + ")"
)


@dataclass(frozen=True)
class Completed:
    """What the recording did: the steps it dispatched, as the columns
    ``dispatch.step_from_row`` takes, and the run's priority to announce them with."""

    dispatched: list[dict[str, Any]]
    priority: int
    # It completed the run itself (its last step).
    run_finished: bool = False


@dataclass(frozen=True)
class Choose:
    """A worker's fair choice made with the recording (``fairness.next_run``'s terms:
    its slot's holder name, the organizations and runs it leaves out, the organization
    of the slot it holds)."""

    me: str
    full: frozenset[Any]
    skip: frozenset[Any]
    held: Any


@dataclass(frozen=True)
class Claim:
    """Who claims the next step with the recording (``claim_next_step``'s terms): the
    run's, or with ``choose`` that of the run its fair choice gives."""

    worker: str
    task_id: str
    lease_seconds: float
    choose: Choose | None = None


@dataclass(frozen=True)
class Next:
    """What the recording claimed for the worker (``claim_next_step``'s fields), and the
    choice it made when asked to (None: not asked; a Choice whose run is None: nothing
    ready that the worker may take)."""

    claimed: dict[str, Any] | None = None
    chosen: Choice | None = None


def eligible(error: object, skipped: bool, cost: Decimal) -> bool:
    """Whether the outcome may take the hot path at all (the function checks the rest:
    the run RUNNING with no approval waiting, the step running this attempt, and so on).
    A negative cost is left to the general path, where credits_charge refuses it."""
    return error is None and not skipped and cost >= 0


def _params(
    run: Run, step_id: int, attempt: int, *, output: Any, cost: Decimal, now: datetime, beat: bool
) -> dict[str, Any]:
    """Every parameter of the statements, for running one of them alone (the tests'
    EXPLAIN); the function sets most of them itself."""
    return {
        **_arguments(run.pk, step_id, attempt, output=output, cost=cost),
        "now": now,
        "priority": run.priority,
        "charge_id": uuid.uuid4(),
        "organization": run.organization_id,
        "charge_key": charge_key(step_id, attempt),
        "beat": beat,
        "settle_id": uuid.uuid4(),
        "settle_reason": settle_reason(run.pk, run.attempt_number),
    }


def _arguments(
    run_id: Any, step_id: int, attempt: int, *, output: Any, cost: Decimal
) -> dict[str, Any]:
    return {
        "step": step_id,
        "attempt": attempt,
        "run": run_id,
        # None is SQL NULL, as the ORM stores it, not a JSON null.
        "output": None if output is None else json.dumps(output),
        "cost": cost,
        "cost_text": str(cost),
        "amount": to_credits(cost),
    }


def complete(
    run_id: Any,
    step_id: int,
    attempt: int,
    *,
    output: Any,
    cost: Decimal,
    claim: Claim | None = None,
) -> tuple[Completed | None, Next]:
    """Complete ``step_id``'s ``attempt`` and advance its task, in one call of
    ``engine_step_completed`` (in the caller's transaction, or its own).

    Returns what it recorded, None when the step is not the plain case or not running
    this attempt (nothing was written: the general path decides), and, with ``claim``,
    what it claimed and chose for that worker (``Next``; nothing when the step was no
    longer running this attempt)."""
    choose = claim.choose if claim is not None else None
    arguments = _arguments(run_id, step_id, attempt, output=output, cost=cost)
    arguments.update(
        claim=claim is not None,
        worker=claim.worker if claim else "",
        task_id=claim.task_id if claim else "",
        lease=claim.lease_seconds if claim else 0.0,
        choose=choose is not None,
        me=choose.me if choose else "",
        full=list(choose.full) if choose else [],
        skip=list(choose.skip) if choose else [],
        held=choose.held if choose else None,
    )
    rows = _CALL.rows(arguments)
    claimed, chosen, recorded = None, None, []
    for row in rows:
        if row[0] == "claimed":
            claimed = claimed_from_json(row[9])
        elif row[0] == "chosen":
            extra = json.loads(row[9]) if isinstance(row[9], str) else row[9]
            organization = extra["organization_id"]
            chosen = Choice(
                run_id=row[6],
                organization_id=uuid.UUID(organization) if organization else None,
                priority=int(row[1] or 0),
                pickup=bool(extra["pickup"]),
                busy=int(extra.get("busy") or 0),
                claimed=claimed,
            )
        else:
            recorded.append(row)
    if chosen is not None and claimed is not None:
        # Claimed from the chosen run, or (nothing claimable before the recording) from
        # this one after it: then the worker goes on with this run, and chooses again
        # after its next step.
        if claimed["run_id"] == chosen.run_id:
            chosen = dataclasses.replace(chosen, claimed=claimed)
        else:
            chosen = None
    after = Next(claimed, chosen)
    if not recorded:
        return None, after
    columns = ("id", "tool", "timeout_ms", "run_id", "attempt_number", "status")
    dispatched = [dict(zip(columns, row[3:9], strict=True)) for row in recorded if row[3]]
    shape = recorded[0][0]
    return Completed(dispatched, int(recorded[0][1]), shape == "last_in_run"), after


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
