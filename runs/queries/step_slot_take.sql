-- A free step slot of an organization below its limit (runs.step_limit), taken by
-- %(holder)s for %(lease)s seconds (runs.admission.fairness.acquire_slot): id, slot, the limit.
-- %(organization)s, %(default)s (ORG_MAX_RUNNING_STEPS). The pick is a CTE made once
-- (MATERIALIZED: runner_jobs_claim.sql says why), SKIP LOCKED so that workers taking
-- slots at once take different ones.
WITH free AS MATERIALIZED (
    SELECT id FROM runs_stepslot
    WHERE organization_id = %(organization)s
      AND slot < runs.step_limit(%(organization)s, %(default)s)
      AND (holder = '' OR expires_at IS NULL OR expires_at < now())
    ORDER BY slot
    LIMIT 1
    FOR UPDATE SKIP LOCKED
)
UPDATE runs_stepslot AS s
SET holder = %(holder)s, expires_at = now() + make_interval(secs => %(lease)s)
FROM free WHERE s.id = free.id
RETURNING s.id, s.slot, runs.step_limit(%(organization)s, %(default)s)
