-- runs.run_counts: an attempt of a run's agents, tasks and steps counted by status.
--
-- One row per (kind, status, handler): kind is 'agents', 'tasks' or 'steps'; handler
-- says whether those steps are on_error handlers (they run only on a failure, so a run's
-- progress leaves them out). What the API's detail of a run and the run page show
-- (runs.selectors.run_summary, runs/queries/run_read.sql): written once, and a plain
-- SQL function, so that the planner inlines it into the statement that calls it.
CREATE FUNCTION runs.run_counts(p_run uuid, p_attempt integer)
RETURNS TABLE (kind text, status text, handler boolean, n bigint)
LANGUAGE sql STABLE AS $$
    SELECT 'agents', status, false, count(*)
    FROM runs_agent WHERE run_id = p_run AND attempt_number = p_attempt GROUP BY status
    UNION ALL
    SELECT 'tasks', status, false, count(*)
    FROM runs_task WHERE run_id = p_run AND attempt_number = p_attempt GROUP BY status
    UNION ALL
    SELECT 'steps', status, handler_for_id IS NOT NULL, count(*)
    FROM runs_step WHERE run_id = p_run AND attempt_number = p_attempt GROUP BY 2, 3
$$;
