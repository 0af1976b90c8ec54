-- runs.run_choose: the run a worker serves next, fairly between organizations.
--
-- Among the organizations with work ready (a running run with a claimable step, or a run
-- waiting to be picked up), not among `p_full` (whose slots the worker found all held):
--   1. the one with the fewest steps executing, weighted by its `share`;
--   2. among those alike, the one served longest ago (runs_fairturn): round robin;
--   3. within it, the run first by priority, then the oldest (FIFO), not in `p_skip`.
-- `p_me` is the holder name of the asking worker's slot: its own slot does not count
-- (or the organization it serves would look busier than it is and it would leave it).
-- `busy`: the other workers executing the chosen organization's steps (a worker serving
-- it looks again less often the more they are: runs.admission.fairness.Choice.busy).
--
-- With `p_held` (the organization of the slot the worker holds), the chosen run's next
-- step is claimed for the worker too (runs.step_claim) when the run is that
-- organization's and running, so that a worker going from run to run asks once, not
-- twice: `claimed` is the claimed step's row as JSON, or NULL. No row: nothing ready.
-- docs/fairness.md.
CREATE FUNCTION runs.run_choose(
    p_me text, p_full uuid[], p_skip uuid[], p_held uuid DEFAULT NULL,
    p_worker text DEFAULT '', p_task_id text DEFAULT '', p_lease float8 DEFAULT 0
) RETURNS TABLE (
    organization_id uuid, run_id uuid, priority smallint, pickup boolean, busy bigint,
    claimed jsonb
) LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    WITH orgs AS (
        SELECT DISTINCT organization_id AS org FROM runs_run
        WHERE status IN ('pending', 'running')
    ), executing AS (
        SELECT organization_id AS org, count(*) AS n FROM runs_stepslot
        WHERE holder <> '' AND holder <> p_me AND expires_at >= now()
        GROUP BY organization_id
    ), best AS (
        SELECT orgs.org, b.id, b.priority, b.created_at, b.pickup
        FROM orgs CROSS JOIN LATERAL (
            SELECT r.id, r.priority, r.created_at, r.status = 'pending' AS pickup
            FROM runs_run AS r
            WHERE r.organization_id = orgs.org
              AND r.status IN ('pending', 'running', 'waiting_approval', 'paused',
                               'resuming', 'escalated')
              AND r.id <> ALL (p_skip)
              AND (
                  (r.status = 'pending' AND r.queued_reason = '')
                  -- Its first claimable step, in the order of the partial index that
                  -- holds them (step_claimable): as EXISTS, a plan that filtered the
                  -- whole step table for the run's rows cost a third of a second.
                  OR (r.status = 'running' AND (
                      SELECT s.id FROM runs_step AS s
                      WHERE s.run_id = r.id AND s.status = 'pending'
                        AND s.dispatched_at IS NOT NULL
                        AND (s.next_run_at IS NULL OR s.next_run_at <= now())
                      ORDER BY s.run_id, s.id
                      LIMIT 1
                  ) IS NOT NULL)
              )
            ORDER BY r.priority, r.created_at, r.id
            LIMIT 1
        ) AS b
        WHERE orgs.org <> ALL (p_full)
    )
    SELECT best.org, best.id, best.priority, best.pickup, COALESCE(executing.n, 0)
    INTO organization_id, run_id, priority, pickup, busy
    FROM best
    JOIN billing_organization AS o ON o.id = best.org
    LEFT JOIN executing ON executing.org = best.org
    LEFT JOIN runs_fairturn AS turn ON turn.organization_id = best.org
    ORDER BY COALESCE(executing.n, 0)::float / GREATEST(o.share, 1),
             turn.served_at NULLS FIRST, best.priority, best.created_at, best.id
    LIMIT 1;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF organization_id = p_held AND NOT pickup THEN
        claimed := (SELECT to_jsonb(c) FROM runs.step_claim(NULL, run_id, p_worker, p_task_id,
                                                              p_lease) AS c);
    END IF;
    RETURN NEXT;
END
$$;
