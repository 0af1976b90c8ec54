-- A run of one organization as its detail shows it (runs.selectors.run_detail): the
-- columns the API shows; its credits over all its attempts (billing.run_credits); the
-- current attempt's agents, tasks and steps counted by status (runs.run_counts: kind,
-- status, on_error handler or not, count); whether it has child runs to read next; and,
-- unless %(outputs)s is false, the first %(inline)s of its completed steps' outputs in
-- plan order (runs.run_outputs: agent, task, step, output). A small run's detail is
-- this one statement, one round trip: a status poll reads this.
-- %(organization)s, %(run)s; %(plan)s: whether to read the plan (`?exclude=plan` does not).
SELECT r.id, r.organization_id, r.name, r.status, r.priority, r.failure_mode, r.mode,
       r.attempt_number, r.max_attempts, r.last_error, r.cancel_reason, r.created_by,
       r.created_at, r.updated_at, r.started_at, r.picked_up_at, r.completed_at,
       r.cancelled_at, r.deleted_at, r.last_heartbeat, r.duration_ms, r.parent_run_id,
       r.parent_step_id, r.depth, r.replan_count, r.queued_reason, r.concurrency_key,
       r.forked_from_run_id, r.forked_from_step,
       (
           SELECT json_agg(fork.id ORDER BY fork.created_at, fork.id)
           FROM runs_run fork WHERE fork.forked_from_run_id = r.id
       ) AS fork_ids,
       CASE WHEN %(plan)s THEN r.plan END AS plan, r.variables,
       credits.reserved AS credits_reserved, credits.charged AS credits_charged,
       credits.refunded AS credits_refunded, credits.held AS credits_held,
       (
           SELECT json_agg(json_build_array(kind, status, handler, n))
           FROM runs.run_counts(r.id, r.attempt_number)
       ) AS counts,
       EXISTS (SELECT FROM runs_run child WHERE child.parent_run_id = r.id) AS has_children,
       CASE WHEN %(outputs)s THEN (
           SELECT json_agg(json_build_array(agent, task, step, output))
           FROM (
               SELECT * FROM runs.run_outputs(r.id, r.attempt_number) LIMIT %(inline)s
           ) first
       ) END AS outputs
FROM runs_run r
CROSS JOIN LATERAL billing.run_credits(r.id) credits
WHERE r.id = %(run)s AND r.organization_id = %(organization)s
