-- runs.run_pick_up: a PENDING run picked up, PENDING -> RUNNING with its attempt's rows.
--
-- For a run its caller holds locked and has seen PENDING (runs.services
-- .run_pick_up_locked: a worker's pick-up, or a start that begins its run at once). The
-- rows are written as runs.attempt_materialize writes them (its arguments), then the
-- run moves as runs.transitions moves a run to RUNNING: its status and timestamps
-- (`picked_up_at` the first time), its event; and its counters start for the agents just
-- written (each open, none active, no approvals waited for), its heartbeat now. Returns
-- the tasks' ids as runs.attempt_materialize does (a wide plan's other steps follow
-- through runs.steps_insert).
CREATE FUNCTION runs.run_pick_up(
    p_run uuid, p_attempt bigint, p_number smallint, p_agents jsonb, p_tasks jsonb,
    p_steps jsonb, p_actor text, p_now timestamptz
) RETURNS bigint[] LANGUAGE plpgsql AS $$
DECLARE
    task_ids bigint[];
BEGIN
    task_ids := runs.attempt_materialize(p_run, p_attempt, p_number, p_agents, p_tasks,
                                           p_steps, p_now);
    UPDATE runs_run AS r
    SET status = 'running', status_changed_at = p_now,
        picked_up_at = COALESCE(r.picked_up_at, p_now), updated_at = p_now,
        agent_count = jsonb_array_length(p_agents), open_children = jsonb_array_length(p_agents),
        active_children = 0, waiting_approvals = 0, last_heartbeat = p_now
    WHERE r.id = p_run AND r.status = 'pending';
    IF NOT FOUND THEN
        RAISE EXCEPTION 'run % is not pending: its pick-up has nothing to move', p_run;
    END IF;
    PERFORM runs.run_event(p_run, p_number, 'run', p_run::text, 'transition', 'pending',
                             'running', p_actor, p_now);
    RETURN task_ids;
END
$$;
