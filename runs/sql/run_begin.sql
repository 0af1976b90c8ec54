-- runs.run_begin: a run just picked up starts its ready work.
--
-- Its ready agents start (up to max_agents), each with its ready tasks (up to
-- max_concurrent_tasks), each of those with its ready steps dispatched (up to
-- max_concurrent_steps, each by runs.free_places): what runs.agents_dispatch does
-- level by level, in one statement. The events go in with one INSERT in that order
-- (an agent, then its tasks by id; agents by position). Returns how many agents started
-- and one row per step dispatched (the columns runs.engine.dispatch.step_from_row
-- takes), in plan order. A ready step that is an approval is left to the general path:
-- nothing is written and nothing returned (there the run may stop to wait for it), as
-- when the run is not RUNNING or has nothing ready.
CREATE FUNCTION runs.run_begin(p_run uuid, p_now timestamptz)
RETURNS TABLE (
    agents bigint, id bigint, tool varchar, timeout_ms bigint, run_id uuid,
    attempt_number smallint, status varchar
) LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH run AS (
        SELECT r.id, r.attempt_number, runs.free_places(r.max_agents, r.active_children) AS free
        FROM runs_run AS r
        WHERE r.id = p_run AND r.status = 'running'
    ), agents AS (
        SELECT a.id, a.position, a.retry_count,
               runs.free_places(a.max_concurrent_tasks, a.active_children) AS free
        FROM runs_agent AS a, run
        WHERE a.run_id = run.id AND a.attempt_number = run.attempt_number
          AND a.status = 'pending' AND a.pending_dependencies = 0 AND a.dispatched_at IS NULL
        ORDER BY a.position
        LIMIT (SELECT free FROM run)
    ), tasks AS (
        -- Each agent's first ready tasks, up to its free slots, and each task's first
        -- ready steps, up to its own: one ordered probe per parent (task_ready,
        -- step_ready hold exactly these rows), whatever the statistics say. Joined
        -- instead, the plan made for the tables' statistics once hashed every step of
        -- the table (test_hotpath_plans.py).
        SELECT t.id, t.agent_id, t.position, t.retry_count,
               runs.free_places(t.max_concurrent_steps, t.active_children) AS free
        FROM agents AS ag
        CROSS JOIN LATERAL (
            SELECT * FROM runs_task AS x
            WHERE x.agent_id = ag.id AND x.generation = ag.retry_count
              AND x.status = 'pending' AND x.pending_dependencies = 0
              AND x.dispatched_at IS NULL
            ORDER BY x.position
            LIMIT ag.free
        ) AS t
    ), steps AS (
        SELECT st.id, st.task_id, st.tool
        FROM tasks AS tk
        CROSS JOIN LATERAL (
            SELECT x.id, x.task_id, x.tool FROM runs_step AS x
            WHERE x.task_id = tk.id AND x.generation = tk.retry_count
              AND x.status = 'pending' AND x.pending_dependencies = 0
              AND x.dispatched_at IS NULL
            ORDER BY x.position
            LIMIT tk.free
        ) AS st
    ), go AS (
        SELECT 1 AS applied
        WHERE EXISTS (SELECT 1 FROM agents)
          AND NOT EXISTS (SELECT 1 FROM steps WHERE tool = 'approval')
    ), moved_agents AS (
        UPDATE runs_agent AS n
        SET status = 'running',
            status_changed_at = p_now,
            started_at = COALESCE(n.started_at, p_now),
            dispatched_at = p_now,
            active_children = n.active_children + COALESCE((
                SELECT count(*) FROM tasks WHERE tasks.agent_id = n.id), 0)
        WHERE n.id = ANY (ARRAY(SELECT id FROM agents)) AND EXISTS (SELECT 1 FROM go)
        RETURNING n.id, n.run_id, n.attempt_number, n.position
    ), moved_tasks AS (
        UPDATE runs_task AS n
        SET status = 'running',
            status_changed_at = p_now,
            started_at = COALESCE(n.started_at, p_now),
            dispatched_at = p_now,
            active_children = n.active_children + COALESCE((
                SELECT count(*) FROM steps WHERE steps.task_id = n.id), 0)
        WHERE n.id = ANY (ARRAY(SELECT id FROM tasks)) AND EXISTS (SELECT 1 FROM go)
        RETURNING n.id, n.run_id, n.attempt_number, n.agent_id, n.position
    ), moved_steps AS (
        -- The ids as the one index condition, never a join: joined on `steps` with the
        -- ids also as an index condition, a plan made while the tables were small
        -- probed all 20,000 ids of a wide fan-out once per step, and its pick-up did not
        -- end in a quarter of an hour (found by the noisy_neighbour bench). Agents and
        -- tasks are moved alike above: RUNNING, dispatched, counting the children
        -- started with them.
        UPDATE runs_step AS st SET dispatched_at = p_now
        WHERE st.id = ANY (ARRAY(SELECT id FROM steps)) AND EXISTS (SELECT 1 FROM go)
        RETURNING st.id, st.tool, st.timeout_ms, st.run_id, st.attempt_number, st.status,
                  st.task_id, st.position
    ), run_counted AS (
        UPDATE runs_run AS r
        SET active_children = r.active_children + (SELECT count(*) FROM agents)
        WHERE r.id = p_run AND EXISTS (SELECT 1 FROM go)
    ), event AS (
        INSERT INTO runs_runevent
            (run_id, attempt_number, entity, entity_id, kind, from_status, to_status, actor,
             message, payload, created_at)
        SELECT run_id, attempt_number, entity, entity_id, 'transition', 'pending', 'running',
               'system', '', '{}'::jsonb, p_now
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
    ORDER BY moved.agent_position, moved.task_position, moved.position;
END
$$;
