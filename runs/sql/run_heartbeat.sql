-- runs.run_heartbeat: a running run's heartbeat, written at most every 5 seconds.
--
-- Every recording of a step beats for its run (the heartbeat sweep fails a RUNNING run
-- whose heartbeat is older than ENGINE_HEARTBEAT_TIMEOUT), but only when the last beat
-- `p_last` (read by the caller with the run) is over 5 seconds old: the run's row is not
-- written on every step. Returns whether it beat.
CREATE FUNCTION runs.run_heartbeat(p_run uuid, p_last timestamptz, p_now timestamptz)
RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    IF p_now - COALESCE(p_last, p_now) <= interval '5 seconds' THEN
        RETURN false;
    END IF;
    UPDATE runs_run SET last_heartbeat = p_now WHERE id = p_run;
    RETURN true;
END
$$;
