-- One more step slot, when every existing one below the organization's limit is held:
-- the next number, taken by %(holder)s (runs.admission.fairness.acquire_slot). Two workers adding
-- the same number meet at the unique constraint; one of them gets it, the other no row.
-- Same parameters and columns as step_slot_take.sql.
INSERT INTO runs_stepslot (organization_id, slot, holder, expires_at)
SELECT %(organization)s, next.slot, %(holder)s, now() + make_interval(secs => %(lease)s)
FROM (
    SELECT COALESCE(MAX(slot) + 1, 0) AS slot FROM runs_stepslot
    WHERE organization_id = %(organization)s
) AS next
WHERE next.slot < runs.step_limit(%(organization)s, %(default)s)
ON CONFLICT (organization_id, slot) DO NOTHING
RETURNING id, slot, runs.step_limit(%(organization)s, %(default)s)
