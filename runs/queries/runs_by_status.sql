-- A page of an organization's runs in some states, newest first, with their credits over
-- all their attempts and how many runs match in all (`total`, on every row): `GET
-- /runs?status=...`, the list's most asked shape (runs.selectors.runs_by_status; every
-- other query of the list goes through runs.filters.RunFilter). Soft-deleted runs are
-- not listed; the plan and variables are not read. The credits are summed for the
-- page's rows only, after the page is cut.
-- %(organization)s, %(statuses)s (text[]), %(limit)s, %(offset)s.
SELECT page.*,
       credits.reserved AS credits_reserved, credits.charged AS credits_charged,
       credits.refunded AS credits_refunded, credits.held AS credits_held,
       (
           SELECT count(*) FROM runs_run
           WHERE organization_id = %(organization)s AND deleted_at IS NULL
             AND status = ANY(%(statuses)s)
       ) AS total
FROM (
    SELECT id, organization_id, name, status, priority, failure_mode, mode, attempt_number,
           max_attempts, last_error, cancel_reason, created_by, created_at, updated_at,
           started_at, picked_up_at, completed_at, cancelled_at, deleted_at, last_heartbeat,
           duration_ms, parent_run_id, parent_step_id, depth, replan_count, queued_reason,
           concurrency_key
    FROM runs_run
    WHERE organization_id = %(organization)s AND deleted_at IS NULL
      AND status = ANY(%(statuses)s)
    ORDER BY created_at DESC, id DESC
    LIMIT %(limit)s OFFSET %(offset)s
) page
CROSS JOIN LATERAL billing.run_credits(page.id) credits
ORDER BY page.created_at DESC, page.id DESC
