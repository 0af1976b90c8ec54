-- engine.step_finish: a running step attempt's RUNNING -> COMPLETED, with its event.
--
-- As runs.transitions would complete it: its output and cost kept, its lease ended, its
-- duration from its start. Only if it is running attempt `p_attempt` and is no on_error
-- handler: the caller (a shape of engine.step_completed) holds its row locked and has
-- checked both, so anything else is a broken invariant and fails the call.
CREATE FUNCTION engine.step_finish(
    p_step bigint, p_attempt integer, p_output text, p_cost numeric, p_cost_text text,
    p_now timestamptz
) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    -- The step and its event in one statement (engine.run_event's insert, here inline:
    -- this runs for every step).
    WITH done AS (
        UPDATE runs_step AS s
        SET status = 'completed',
            status_changed_at = p_now,
            completed_at = p_now,
            duration_ms = engine.duration_ms(p_now, s.started_at, s.created_at),
            output = p_output::jsonb,
            cost = s.cost + p_cost,
            lease_expires_at = NULL
        WHERE s.id = p_step AND s.status = 'running' AND s.attempts = p_attempt
          AND s.handler_for_id IS NULL
        RETURNING s.run_id, s.attempt_number
    )
    INSERT INTO runs_runevent
        (run_id, attempt_number, entity, entity_id, kind, from_status, to_status, actor,
         message, payload, created_at)
    SELECT done.run_id, done.attempt_number, 'step', p_step::text, 'transition', 'running',
           'completed', 'system', '', jsonb_build_object('cost', p_cost_text), p_now
    FROM done;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'step % is not running attempt %', p_step, p_attempt;
    END IF;
END
$$;
