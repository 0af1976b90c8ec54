-- A run of one organization, by id, as the lists of its parts need it (runs.selectors.
-- run_get): whether it is the organization's, and its current attempt. %(organization)s,
-- %(run)s.
SELECT id, organization_id, status, attempt_number
FROM runs_run
WHERE id = %(run)s AND organization_id = %(organization)s
