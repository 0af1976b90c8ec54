-- A step cache entry written (runs.reuse.cache_add): one entry per organization, key,
-- tool and inputs, the newest write replacing the older in place, in one statement that
-- two completions at once cannot both insert. The replaced row takes the id the insert
-- drew (EXCLUDED.id, the sequence's next), not only the new time: the retention sweep
-- walks this table by id, oldest first, and stops at the first recent row
-- (orchestrator/retention.py), so ids must keep growing with `created_at`.
-- %(organization)s, %(key)s, %(tool)s, %(inputs)s, %(run)s, %(step)s, %(now)s.
INSERT INTO runs_stepcacheentry AS entry
    (organization_id, key, tool, inputs, run_id, step_id, created_at)
VALUES
    (%(organization)s, %(key)s, %(tool)s, %(inputs)s, %(run)s, %(step)s, %(now)s)
ON CONFLICT (organization_id, key, tool, inputs) DO UPDATE
SET id = EXCLUDED.id, run_id = EXCLUDED.run_id, step_id = EXCLUDED.step_id,
    created_at = EXCLUDED.created_at
RETURNING id
