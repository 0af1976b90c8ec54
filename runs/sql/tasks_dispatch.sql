-- runs.tasks_dispatch: a running agent's ready tasks started, within its free places,
-- each with its ready steps dispatched (runs.steps_dispatch).
--
-- For an agent and a run both RUNNING: its tasks of the current generation that wait for
-- nothing, first ones first, up to runs.free_places, go PENDING -> RUNNING, dispatched,
-- with their events (by id), counted in the agent's active children. Returns the steps
-- dispatched, task by task in plan order (runs.steps_dispatch's rows).
CREATE FUNCTION runs.tasks_dispatch(p_agent bigint, p_now timestamptz)
RETURNS TABLE (
    id bigint, tool varchar, timeout_ms bigint, run_id uuid, attempt_number smallint,
    status varchar
) LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_generation integer;
    v_free integer;
    v_ready bigint[];
    v_task bigint;
BEGIN
    SELECT a.retry_count, runs.free_places(a.max_concurrent_tasks, a.active_children)
      INTO v_generation, v_free
      FROM runs_agent AS a JOIN runs_run AS r ON r.id = a.run_id
     WHERE a.id = p_agent AND a.status = 'running' AND r.status = 'running';
    IF NOT FOUND OR v_free = 0 THEN
        RETURN;
    END IF;
    v_ready := ARRAY(
        SELECT t.id FROM runs_task AS t
        WHERE t.agent_id = p_agent AND t.generation = v_generation AND t.status = 'pending'
          AND t.pending_dependencies = 0 AND t.dispatched_at IS NULL
        ORDER BY t.position
        LIMIT v_free
    );
    IF v_ready = '{}' THEN
        RETURN;
    END IF;
    UPDATE runs_task AS t
    SET status = 'running', status_changed_at = p_now,
        started_at = COALESCE(t.started_at, p_now), dispatched_at = p_now
    WHERE t.id = ANY (v_ready);
    INSERT INTO runs_runevent
        (run_id, attempt_number, entity, entity_id, kind, from_status, to_status, actor,
         message, payload, created_at)
    SELECT t.run_id, t.attempt_number, 'task', t.id::text, 'transition', 'pending',
           'running', 'system', '', '{}'::jsonb, p_now
    FROM runs_task AS t WHERE t.id = ANY (v_ready)
    ORDER BY t.id;
    UPDATE runs_agent SET active_children = active_children + cardinality(v_ready)
    WHERE id = p_agent;
    FOR v_task IN SELECT t.id FROM runs_task AS t WHERE t.id = ANY (v_ready)
                  ORDER BY t.position LOOP
        RETURN QUERY SELECT * FROM runs.steps_dispatch(v_task, p_now);
    END LOOP;
END
$$;
