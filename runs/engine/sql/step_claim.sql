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
    status_changed_at timestamptz, rate_limits jsonb, reused_from jsonb, cache jsonb,
    more boolean
) LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    IF p_step IS NULL THEN
        SELECT s.id INTO p_step FROM runs_step AS s
        -- The run as a range of one, in the order of step_claimable (run, id), the one
        -- index that gives it: with `run_id = p_run` the run drops out of the order, and
        -- a plan made for any run (PL/pgSQL keeps one after a few calls) read steps in
        -- id order through the primary key, all of them when a few runs held most.
        WHERE s.run_id >= p_run AND s.run_id <= p_run
          AND s.status = 'pending'
          AND s.dispatched_at IS NOT NULL
          AND (s.next_run_at IS NULL OR s.next_run_at <= p_now)
        ORDER BY s.run_id, s.id
        LIMIT 1
        FOR NO KEY UPDATE SKIP LOCKED;
        IF NOT FOUND THEN
            RETURN;
        END IF;
    END IF;
    -- The step and its event in one statement (engine.run_event's insert, here inline:
    -- this runs for every step, and a statement and a call less are a tenth of it).
    WITH claimed AS (
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
          -- The run by its key: as a join, a generic plan made while few runs were
          -- running scanned every running run for it.
          AND (SELECT r.status FROM runs_run AS r WHERE r.id = s.run_id) = 'running'
        RETURNING s.*
    ), event AS (
        INSERT INTO runs_runevent
            (run_id, attempt_number, entity, entity_id, kind, from_status, to_status, actor,
             message, payload, created_at)
        SELECT c.run_id, c.attempt_number, 'step', c.id::text, 'transition', 'pending',
               'running', p_worker, '', jsonb_build_object('attempt', c.attempts), p_now
        FROM claimed AS c
    )
    SELECT c.id, c.run_id, c.attempt_number, c.attempts, c.task_id, c.generation, c.name,
           c.tool, c.params, c."when", c.timeout_ms, c.handler_for_id, c.dispatched_at,
           c.status_changed_at, c.rate_limits, c.reused_from, c.cache
    INTO id, run_id, attempt_number, attempts, task_id, generation, name, tool, params,
         "when", timeout_ms, handler_for_id, dispatched_at, status_changed_at, rate_limits,
         reused_from, cache
    FROM claimed AS c;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    -- One probe of the partial index step_claimable, as the pick above (rows being
    -- claimed by others at this moment included; the step claimed above is running now).
    more := (
        SELECT other.id FROM runs_step AS other
        WHERE other.run_id >= step_claim.run_id AND other.run_id <= step_claim.run_id
          AND other.status = 'pending'
          AND other.dispatched_at IS NOT NULL
          AND (other.next_run_at IS NULL OR other.next_run_at <= p_now)
        ORDER BY other.run_id, other.id
        LIMIT 1
    ) IS NOT NULL;
    RETURN NEXT;
END
$$;
