-- A page of runs' credits over all their attempts (billing.run_credits), for runs already
-- read (runs.selectors.attach_credits). %(runs)s: the page's run ids.
SELECT run_id, credits.reserved, credits.charged, credits.refunded, credits.held
FROM unnest(%(runs)s::uuid[]) AS run_id
CROSS JOIN LATERAL billing.run_credits(run_id) credits
