-- runs.run_outputs: the completed steps of a run's attempt in plan order, each with the
-- names of its agent and task and its output: what a run's detail shows as
-- `{"agent.task.step": output}` (runs.selectors.run_outputs, runs/queries/run_read.sql,
-- which reads the first few inline). A SQL function the planner inlines.
CREATE FUNCTION runs.run_outputs(p_run uuid, p_attempt integer)
RETURNS TABLE (agent text, task text, step text, output jsonb)
LANGUAGE sql STABLE AS $$
    SELECT a.name, t.name, s.name, s.output
    FROM runs_step s
    JOIN runs_task t ON t.id = s.task_id
    JOIN runs_agent a ON a.id = t.agent_id
    WHERE s.run_id = p_run AND s.attempt_number = p_attempt AND s.status = 'completed'
    ORDER BY a.position, t.position, s.generation, s.position
$$;
