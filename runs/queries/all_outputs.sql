-- The outputs of the completed steps of a run's attempt, in plan order
-- (engine.run_outputs; runs.selectors.run_outputs). %(run)s, %(attempt)s.
SELECT agent, task, step, output FROM engine.run_outputs(%(run)s, %(attempt)s)
