-- runs.task_finish: a running task's RUNNING -> COMPLETED when its last open step
-- completed, with its event; the step that ended it counted off (open and active).
CREATE FUNCTION runs.task_finish(p_task bigint, p_now timestamptz)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_run uuid;
    v_attempt_number smallint;
BEGIN
    UPDATE runs_task AS t
    SET status = 'completed',
        status_changed_at = p_now,
        completed_at = p_now,
        duration_ms = runs.duration_ms(p_now, t.started_at, t.created_at),
        open_children = t.open_children - 1,
        active_children = t.active_children - 1
    WHERE t.id = p_task
    RETURNING t.run_id, t.attempt_number INTO v_run, v_attempt_number;
    PERFORM runs.run_event(v_run, v_attempt_number, 'task', p_task::text, 'transition',
                             'running', 'completed', 'system', p_now);
END
$$;
