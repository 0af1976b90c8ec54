-- runs.run_finish: a running run whose last agent finished goes RUNNING -> COMPLETED.
--
-- Every run's completion is written here: the hot path's (runs.record_last_in_run, its
-- last step recorded) and the general path's (runs.services.run_complete, after
-- runs.child_done counted its last agent off). The run's row (its end and its duration,
-- and `p_counted` taken off its open and active children: the agent the caller finished
-- in the same call, 0 when it was counted already), its event, and its attempt closed
-- with the reservation settled (runs.attempt_close: the attempt's charges entered and
-- the rest refunded, its own event). The caller holds the run's row locked and found it
-- RUNNING with no agent open but the one it counts; what Python does beyond the
-- database when a run ends (a parent told, the organization's waiting runs looked at
-- again) is the caller's.
CREATE FUNCTION runs.run_finish(
    p_run uuid, p_attempt_number smallint, p_counted integer, p_actor text,
    p_now timestamptz
) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    UPDATE runs_run AS r
    SET status = 'completed',
        status_changed_at = p_now,
        completed_at = p_now,
        duration_ms = runs.duration_ms(p_now, r.started_at, r.created_at),
        updated_at = p_now,
        open_children = r.open_children - p_counted,
        active_children = r.active_children - p_counted
    WHERE r.id = p_run AND r.status = 'running';
    IF NOT FOUND THEN
        RAISE EXCEPTION 'run % is not running', p_run;
    END IF;
    PERFORM runs.run_event(p_run, p_attempt_number, 'run', p_run::text, 'transition',
                             'running', 'completed', p_actor, p_now);
    PERFORM runs.attempt_close(p_run, p_attempt_number, 'completed', p_now, p_actor, p_now);
END
$$;
