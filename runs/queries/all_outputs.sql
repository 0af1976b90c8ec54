-- The outputs of the completed steps of a run's attempt, in plan order
-- (runs.run_outputs; runs.selectors.run_outputs). %(run)s, %(attempt)s.
SELECT agent, task, step, output FROM runs.run_outputs(%(run)s, %(attempt)s)
