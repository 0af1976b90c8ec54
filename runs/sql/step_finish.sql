-- runs.step_finish: a running step attempt's RUNNING -> COMPLETED, with its event.
--
-- Every completion of a step is written here, the hot path's (a shape of
-- runs.step_completed) and the general path's (runs.engine.outcomes: an on_error
-- handler, a borrowed output, a run that is not plainly running): its output and cost
-- kept, its lease ended, its duration from its start, and an output it borrowed said so
-- (`p_reused_from` or `p_cached_from`, the source; the caller writes the `reuse` event
-- that tells it). Its event is kept on its row, as its claim's is: the id drawn from the
-- events' sequence (completion_event) and the cost it shows, as the recording wrote it
-- (completion_cost); runs.run_history lists it as the row it replaces would be. Only
-- if it is running attempt `p_attempt`: the caller holds its row locked and has checked
-- it, so anything else is a broken invariant and fails the call.
CREATE FUNCTION runs.step_finish(
    p_step bigint, p_attempt integer, p_output text, p_cost numeric, p_cost_text text,
    p_now timestamptz, p_reused_from jsonb DEFAULT NULL, p_cached_from jsonb DEFAULT NULL
) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    UPDATE runs_step AS s
    SET status = 'completed',
        status_changed_at = p_now,
        completed_at = p_now,
        duration_ms = runs.duration_ms(p_now, s.started_at, s.created_at),
        output = p_output::jsonb,
        cost = s.cost + p_cost,
        lease_expires_at = NULL,
        completion_event = nextval('runs_runevent_id_seq'),
        completion_cost = p_cost_text,
        reused_from = COALESCE(p_reused_from, s.reused_from),
        cached_from = COALESCE(p_cached_from, s.cached_from)
    WHERE s.id = p_step AND s.status = 'running' AND s.attempts = p_attempt;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'step % is not running attempt %', p_step, p_attempt;
    END IF;
END
$$;
