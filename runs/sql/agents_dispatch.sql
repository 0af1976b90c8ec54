-- runs.agents_dispatch: a running run's ready agents started, within its free places,
-- each with its ready tasks started and their ready steps dispatched
-- (runs.tasks_dispatch).
--
-- For a RUNNING run: its agents of the current attempt that wait for nothing, first ones
-- first, up to runs.free_places, go PENDING -> RUNNING one by one, dispatched, with
-- their event, counted in the run's active children, each followed by its tasks. Returns
-- the steps dispatched, agent by agent in plan order (runs.steps_dispatch's rows).
-- runs.run_begin does the same for a run just picked up, in one statement, when no
-- approval is among them.
CREATE FUNCTION runs.agents_dispatch(p_run uuid, p_now timestamptz)
RETURNS TABLE (
    id bigint, tool varchar, timeout_ms bigint, run_id uuid, attempt_number smallint,
    status varchar
) LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_attempt_number smallint;
    v_free integer;
    v_agent bigint;
BEGIN
    SELECT r.attempt_number, runs.free_places(r.max_agents, r.active_children)
      INTO v_attempt_number, v_free
      FROM runs_run AS r WHERE r.id = p_run AND r.status = 'running';
    IF NOT FOUND OR v_free = 0 THEN
        RETURN;
    END IF;
    FOR v_agent IN
        SELECT a.id FROM runs_agent AS a
        WHERE a.run_id = p_run AND a.attempt_number = v_attempt_number
          AND a.status = 'pending' AND a.pending_dependencies = 0 AND a.dispatched_at IS NULL
        ORDER BY a.position
        LIMIT v_free
    LOOP
        UPDATE runs_agent AS a
        SET status = 'running', status_changed_at = p_now,
            started_at = COALESCE(a.started_at, p_now), dispatched_at = p_now
        WHERE a.id = v_agent;
        PERFORM runs.run_event(p_run, v_attempt_number, 'agent', v_agent::text,
                                 'transition', 'pending', 'running', 'system', p_now);
        UPDATE runs_run SET active_children = active_children + 1 WHERE id = p_run;
        RETURN QUERY SELECT * FROM runs.tasks_dispatch(v_agent, p_now);
    END LOOP;
END
$$;
