-- runs.steps_dispatch: a running task's ready steps dispatched, within its free places.
--
-- For a task and a run both RUNNING: its steps of the current generation that wait for
-- nothing, first ones first, up to runs.free_places, are marked dispatched and counted
-- in the task's active children. An approval step (not one that reuses an earlier
-- decision, runs.reuse) is never sent to a worker: it goes PENDING -> WAITING_APPROVAL
-- with its event, counted in the run's waiting_approvals. Returns every step dispatched,
-- in plan order, with its status after (the caller announces the PENDING ones and looks
-- at the run's waiting state when any waits for a person: runs.engine.dispatch).
CREATE FUNCTION runs.steps_dispatch(p_task bigint, p_now timestamptz)
RETURNS TABLE (
    id bigint, tool varchar, timeout_ms bigint, run_id uuid, attempt_number smallint,
    status varchar
) LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_run uuid;
    v_generation smallint;
    v_free integer;
    v_ready bigint[];
    v_approvals bigint[];
BEGIN
    SELECT t.run_id, t.retry_count, runs.free_places(t.max_concurrent_steps, t.active_children)
      INTO v_run, v_generation, v_free
      FROM runs_task AS t JOIN runs_run AS r ON r.id = t.run_id
     WHERE t.id = p_task AND t.status = 'running' AND r.status = 'running';
    IF NOT FOUND OR v_free = 0 THEN
        RETURN;
    END IF;
    v_ready := ARRAY(
        SELECT s.id FROM runs_step AS s
        WHERE s.task_id = p_task AND s.generation = v_generation AND s.status = 'pending'
          AND s.pending_dependencies = 0 AND s.dispatched_at IS NULL
        ORDER BY s.position
        LIMIT v_free
    );
    IF v_ready = '{}' THEN
        RETURN;
    END IF;
    UPDATE runs_step SET dispatched_at = p_now WHERE id = ANY (v_ready);
    UPDATE runs_task SET active_children = active_children + cardinality(v_ready)
    WHERE id = p_task;
    v_approvals := ARRAY(
        SELECT s.id FROM runs_step AS s
        WHERE s.id = ANY (v_ready) AND s.tool = 'approval'
          AND COALESCE(s.reused_from, '{}'::jsonb) IN ('{}'::jsonb, 'null'::jsonb)
        ORDER BY s.id
    );
    IF v_approvals <> '{}' THEN
        UPDATE runs_step SET status = 'waiting_approval', status_changed_at = p_now
        WHERE id = ANY (v_approvals);
        INSERT INTO runs_runevent
            (run_id, attempt_number, entity, entity_id, kind, from_status, to_status, actor,
             message, payload, created_at)
        SELECT s.run_id, s.attempt_number, 'step', s.id::text, 'transition', 'pending',
               'waiting_approval', 'system', 'waiting for approval', '{}'::jsonb, p_now
        FROM runs_step AS s WHERE s.id = ANY (v_approvals)
        ORDER BY s.id;
        UPDATE runs_run SET waiting_approvals = waiting_approvals + cardinality(v_approvals)
        WHERE id = v_run;
    END IF;
    RETURN QUERY
    SELECT s.id, s.tool, s.timeout_ms, s.run_id, s.attempt_number, s.status
    FROM runs_step AS s WHERE s.id = ANY (v_ready)
    ORDER BY s.position;
END
$$;
