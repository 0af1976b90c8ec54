-- runs.node_finish: an agent or task (`p_entity`) whose last open child finished goes
-- from `p_from` (its status, read by the caller under the run's lock) to `p_to`
-- (COMPLETED or SKIPPED), with its event, as runs.transitions moves a row: a no-op when
-- it is there already, refused when the transition table (runs.states) refuses it
-- (SQLSTATE OEI01, its detail "entity from to": runs.engine.propagation raises
-- InvalidTransition, and the caller's savepoint undoes what the call wrote).
CREATE FUNCTION runs.node_finish(
    p_entity text, p_id bigint, p_from text, p_to text, p_now timestamptz
) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_run uuid;
    v_attempt_number smallint;
BEGIN
    IF p_from = p_to THEN
        RETURN;
    END IF;
    IF NOT (p_from IN ('running', 'paused') OR (p_from = 'pending' AND p_to = 'skipped')) THEN
        RAISE EXCEPTION USING ERRCODE = 'OEI01',
            MESSAGE = format('%s cannot go from %s to %s', p_entity, p_from, p_to),
            DETAIL = format('%s %s %s', p_entity, p_from, p_to);
    END IF;
    IF p_entity = 'task' THEN
        UPDATE runs_task AS t
        SET status = p_to, status_changed_at = p_now, completed_at = p_now,
            duration_ms = runs.duration_ms(p_now, t.started_at, t.created_at)
        WHERE t.id = p_id
        RETURNING t.run_id, t.attempt_number INTO v_run, v_attempt_number;
    ELSE
        UPDATE runs_agent AS a
        SET status = p_to, status_changed_at = p_now, completed_at = p_now,
            duration_ms = runs.duration_ms(p_now, a.started_at, a.created_at)
        WHERE a.id = p_id
        RETURNING a.run_id, a.attempt_number INTO v_run, v_attempt_number;
    END IF;
    PERFORM runs.run_event(v_run, v_attempt_number, p_entity, p_id::text, 'transition',
                             p_from, p_to, 'system', p_now);
END
$$;
