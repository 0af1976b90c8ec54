-- The child runs a run's `run` steps started, oldest first (runs.selectors.run_detail).
-- %(run)s.
SELECT id, status, parent_mode, parent_step_id, created_at
FROM runs_run
WHERE parent_run_id = %(run)s
ORDER BY created_at
