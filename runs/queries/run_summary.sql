-- An attempt of a run's agents, tasks and steps counted by status (runs.selectors.
-- run_summary; runs.run_counts says what each row is). %(run)s, %(attempt)s.
SELECT kind, status, handler, n FROM runs.run_counts(%(run)s, %(attempt)s)
