-- runs.attempt_materialize: an attempt's agents, tasks and steps, written from their rows.
--
-- runs.materialize works out each new row's values from the typed plan (the wiring, the
-- plan's settings; once, in Python: agent_values, task_values, step_values) and sends
-- them here as three JSON arrays: `p_agents`; `p_tasks`, each naming its agent by
-- position ("agent"), in agent then task position order; `p_steps`, each naming its
-- task by index in `p_tasks` ("task"), written by runs.steps_insert. What a new node
-- starts with (PENDING, nothing open yet but its children, nothing active, generation 0
-- of its retries) is set here. Ids are given in position order, as bulk inserts gave
-- them. Returns the tasks' ids in `p_tasks`' order: a wide plan sends its other steps in
-- later batches (runs.steps_insert), naming their tasks the same way.
CREATE FUNCTION runs.attempt_materialize(
    p_run uuid, p_attempt bigint, p_number smallint, p_agents jsonb, p_tasks jsonb,
    p_steps jsonb, p_now timestamptz
) RETURNS bigint[] LANGUAGE plpgsql AS $$
DECLARE
    task_ids bigint[];
BEGIN
    WITH agents AS (
        INSERT INTO runs_agent
            (created_at, status_changed_at, run_id, attempt_id, attempt_number, name,
             position, status, mode, failure_mode, max_concurrent_tasks, depends_on,
             pending_dependencies, dependents, task_count, open_children, active_children,
             retry_count, timeout_ms)
        SELECT p_now, p_now, p_run, p_attempt, p_number, a.name, a.position, 'pending',
               a.mode, a.failure_mode, a.max_concurrent_tasks, a.depends_on,
               a.pending_dependencies, a.dependents, a.task_count, a.task_count, 0, 0,
               a.timeout_ms
        FROM jsonb_to_recordset(p_agents) AS a(
            name text, position integer, mode text, failure_mode text,
            max_concurrent_tasks integer, depends_on jsonb, pending_dependencies integer,
            dependents jsonb, task_count integer, timeout_ms bigint)
        ORDER BY a.position
        RETURNING id, position
    ), tasks AS (
        INSERT INTO runs_task
            (created_at, status_changed_at, run_id, agent_id, attempt_number, name,
             position, generation, status, mode, failure_mode, max_concurrent_steps,
             depends_on, pending_dependencies, dependents, step_count, open_children,
             active_children, retry_count, timeout_ms)
        SELECT p_now, p_now, p_run, agents.id, p_number, t.name, t.position, t.generation,
               'pending', t.mode, t.failure_mode, t.max_concurrent_steps, t.depends_on,
               t.pending_dependencies, t.dependents, t.step_count, t.step_count, 0, 0,
               t.timeout_ms
        FROM jsonb_to_recordset(p_tasks) AS t(
            agent integer, name text, position integer, generation smallint, mode text,
            failure_mode text, max_concurrent_steps integer, depends_on jsonb,
            pending_dependencies integer, dependents jsonb, step_count integer,
            timeout_ms bigint)
        JOIN agents ON agents.position = t.agent
        ORDER BY t.agent, t.position
        RETURNING id, agent_id, position
    )
    SELECT array_agg(tasks.id ORDER BY agents.position, tasks.position) INTO task_ids
    FROM tasks JOIN agents ON agents.id = tasks.agent_id;
    PERFORM runs.steps_insert(p_run, p_number, task_ids, p_steps, p_now);
    RETURN COALESCE(task_ids, '{}');
END
$$;
