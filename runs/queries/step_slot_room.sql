-- Whether an organization has fewer slots below its limit than the limit (a slot may be
-- free to add): runs.admission.fairness.acquire_slot asks after a take and an add both found none.
-- %(organization)s, %(default)s.
SELECT count(*) < runs.step_limit(%(organization)s, %(default)s) FROM runs_stepslot
WHERE organization_id = %(organization)s
  AND slot < runs.step_limit(%(organization)s, %(default)s)
