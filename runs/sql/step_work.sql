-- runs.step_work: the id of the work a step's latest attempt started elsewhere (the
-- latest is the current one: a step's attempts only grow): a `runner` step's runner job
-- (one per attempt, runnerjob_one_per_attempt), a `run` step's child run (one per
-- attempt, run_one_child_per_step_attempt). NULL until the attempt creates it, and for
-- every other tool. One index probe; what the API's steps and the run page show
-- (runs/queries/steps_page.sql, runs.selectors.with_work). A one-row table function, to
-- be inlined where it is called (runs.event_path says why).
CREATE FUNCTION runs.step_work(p_step bigint, p_tool text)
RETURNS TABLE (work uuid) LANGUAGE sql STABLE AS $$
    SELECT CASE p_tool
        WHEN 'runner' THEN (
            SELECT id FROM runs_runnerjob WHERE step_id = p_step ORDER BY attempt DESC LIMIT 1
        )
        WHEN 'run' THEN (
            SELECT id FROM runs_run
            WHERE parent_step_id = p_step
            ORDER BY parent_step_attempt DESC LIMIT 1
        )
    END
$$;
