-- The outputs of the completed steps of a run's attempt (runs.selectors.run_outputs), in
-- plan order, each with the names of its agent and task: one statement, no join through
-- the ORM's model instances. %(run)s, %(attempt)s.
SELECT a.name, t.name, s.name, s.output
FROM runs_step s
JOIN runs_task t ON t.id = s.task_id
JOIN runs_agent a ON a.id = t.agent_id
WHERE s.run_id = %(run)s AND s.attempt_number = %(attempt)s AND s.status = 'completed'
ORDER BY a.position, t.position, s.generation, s.position
