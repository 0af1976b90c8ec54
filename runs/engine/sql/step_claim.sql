-- engine.step_claim: a worker's PENDING -> RUNNING for one attempt of a step: `p_step`,
-- or (NULL) the next claimable step of the run `p_run`.
--
-- The run's next is its first step in plan order that is pending, dispatched and due
-- (the rows of the partial index step_claimable). Rows that another worker is claiming
-- at this moment are skipped, not waited for: two workers serving one run never queue
-- behind each other's claim.
--
-- Claimed only if the step is pending, dispatched and due, and its run RUNNING: then it runs
-- attempt `attempts + 1` under a lease, with its event; otherwise nothing is written and
-- no row returned (a duplicate or late message, a paused or cancelled run: a no-op).
-- Returns what the attempt needs (runs.transitions._CLAIMED_FIELDS), and `more`: whether
-- the run has another claimable step now, so that the server that claimed this one may
-- call for help (orchestrator.executor).
CREATE FUNCTION engine.step_claim(
    p_step bigint, p_run uuid, p_worker text, p_task_id text, p_lease float8,
    p_now timestamptz DEFAULT now()
) RETURNS TABLE (
    id bigint, run_id uuid, attempt_number smallint, attempts integer, task_id bigint,
    generation smallint, name varchar, tool varchar, params jsonb, "when" text,
    timeout_ms bigint, handler_for_id bigint, dispatched_at timestamptz,
    status_changed_at timestamptz, rate_limits jsonb, more boolean
) LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    IF p_step IS NULL THEN
        SELECT s.id INTO p_step FROM runs_step AS s
        WHERE s.run_id = p_run
          AND s.status = 'pending'
          AND s.dispatched_at IS NOT NULL
          AND (s.next_run_at IS NULL OR s.next_run_at <= p_now)
        -- The order of step_claimable (run, id): by id alone, a generic plan read the
        -- run's pending steps by another index and sorted them all.
        ORDER BY s.run_id, s.id
        LIMIT 1
        FOR NO KEY UPDATE SKIP LOCKED;
        IF NOT FOUND THEN
            RETURN;
        END IF;
    END IF;
    UPDATE runs_step AS s
    SET status = 'running',
        attempts = s.attempts + 1,
        started_at = COALESCE(s.started_at, p_now),
        status_changed_at = p_now,
        lease_expires_at = p_now + make_interval(secs => p_lease),
        next_run_at = NULL,
        worker = p_worker,
        celery_task_id = p_task_id
    WHERE s.id = p_step
      AND s.status = 'pending'
      AND s.dispatched_at IS NOT NULL
      AND (s.next_run_at IS NULL OR s.next_run_at <= p_now)
      -- The run by its key: as a join, a generic plan made while few runs were running
      -- scanned every running run for it.
      AND (SELECT r.status FROM runs_run AS r WHERE r.id = s.run_id) = 'running'
    RETURNING s.id, s.run_id, s.attempt_number, s.attempts, s.task_id, s.generation, s.name,
              s.tool, s.params, s."when", s.timeout_ms, s.handler_for_id, s.dispatched_at,
              s.status_changed_at, s.rate_limits
    INTO id, run_id, attempt_number, attempts, task_id, generation, name, tool, params,
         "when", timeout_ms, handler_for_id, dispatched_at, status_changed_at, rate_limits;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    PERFORM engine.run_event(run_id, attempt_number, 'step', id::text, 'transition',
                             'pending', 'running', p_worker, p_now, '',
                             jsonb_build_object('attempt', attempts));
    -- One probe of the partial index step_claimable (rows being claimed by others at
    -- this moment included; the step claimed above is running now). Planned for this
    -- run each time (EXECUTE): planned once for any run (PL/pgSQL's generic plan), with
    -- a table of a few runs of many steps it walked the primary key through all of them.
    EXECUTE 'SELECT EXISTS (SELECT 1 FROM runs_step'
         || ' WHERE run_id = $1 AND status = ''pending'' AND dispatched_at IS NOT NULL'
         || ' AND (next_run_at IS NULL OR next_run_at <= $2))'
       INTO more USING run_id, p_now;
    RETURN NEXT;
END
$$;
