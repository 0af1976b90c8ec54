-- runs.step_claim: a worker's PENDING -> RUNNING for one attempt of a step: `p_step`,
-- or (NULL) the next claimable step of the run `p_run`; with `p_batch` over 1, up to that
-- many of the run's next claimable steps at once (a batch: docs/engine.md, "Batches").
--
-- The run's next is its first step in plan order that is pending, dispatched and due
-- (the rows of the partial index step_claimable). Rows that another worker is claiming
-- at this moment are skipped, not waited for: two workers serving one run never queue
-- behind each other's claim.
--
-- A batch takes at most half of the run's claimable steps (counted up to twice
-- `p_batch`), so that as many are left for other servers as it takes, and only steps of
-- the task of its first: a cancel that ends one of them ends the step its worker is
-- running too, and the revoke that comes with it stops nothing else.
--
-- Claimed only if the step is pending, dispatched and due, and its run RUNNING: then it runs
-- attempt `attempts + 1` under a lease, with its event (kept on the step's row: its id
-- drawn from the events' sequence, claim_event, and its time, claimed_at; listed by
-- runs.run_history as the row it replaces would be); otherwise nothing is written and
-- no row returned (a duplicate or late message, a paused or cancelled run: a no-op).
-- Returns what each attempt needs (runs.transitions._CLAIMED_FIELDS), in plan order, and
-- `more`: whether the run has another claimable step now, so that the server that
-- claimed these may call for help (orchestrator.executor).
--
-- `p_held`: a step of `p_run` that the caller's recording has just made ready and left
-- undispatched, because this claim takes it first (runs.step_claimed_next said so):
-- it is released, dispatched and claimed by one UPDATE, one row version where a
-- dispatch and then a claim wrote two (docs/engine.md, "The path of one step").
CREATE FUNCTION runs.step_claim(
    p_step bigint, p_run uuid, p_worker text, p_task_id text, p_lease float8,
    p_now timestamptz DEFAULT now(), p_batch integer DEFAULT 1, p_held bigint DEFAULT NULL
) RETURNS TABLE (
    id bigint, run_id uuid, attempt_number smallint, attempts integer, task_id bigint,
    generation smallint, name varchar, tool varchar, params jsonb, "when" text,
    timeout_ms bigint, handler_for_id bigint, dispatched_at timestamptz,
    status_changed_at timestamptz, rate_limits jsonb, reused_from jsonb, cache jsonb,
    more boolean
) LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_steps bigint[];
    v_ready integer;
    v_step bigint;
BEGIN
    IF p_step IS NOT NULL THEN
        v_steps := ARRAY[p_step];
    ELSIF p_held IS NOT NULL AND p_batch <= 1 THEN
        v_steps := ARRAY[p_held];  -- the run's first claimable, were it dispatched
    ELSIF p_batch <= 1 THEN
        SELECT ARRAY[s.id] INTO v_steps FROM runs_step AS s
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
    ELSE
        -- How many are claimable, up to twice the batch (rows being claimed by others
        -- included), then at most half of them picked, as the single pick above.
        SELECT count(*) INTO v_ready FROM (
            SELECT 1 FROM runs_step AS s
            WHERE s.run_id >= p_run AND s.run_id <= p_run
              AND s.status = 'pending'
              AND s.dispatched_at IS NOT NULL
              AND (s.next_run_at IS NULL OR s.next_run_at <= p_now)
            ORDER BY s.run_id, s.id
            LIMIT 2 * p_batch
        ) AS ready;
        IF p_held IS NOT NULL THEN
            v_ready := LEAST(v_ready + 1, 2 * p_batch);  -- the held step is one, the first
        END IF;
        IF v_ready = 0 THEN
            RETURN;
        END IF;
        WITH others AS MATERIALIZED (
            SELECT s.id, s.task_id FROM runs_step AS s
            WHERE s.run_id >= p_run AND s.run_id <= p_run
              AND s.status = 'pending'
              AND s.dispatched_at IS NOT NULL
              AND (s.next_run_at IS NULL OR s.next_run_at <= p_now)
            ORDER BY s.run_id, s.id
            LIMIT GREATEST(1, LEAST(p_batch, v_ready / 2)) - (p_held IS NOT NULL)::int
            FOR NO KEY UPDATE SKIP LOCKED
        ), picked AS (
            SELECT held.id, held.task_id FROM runs_step AS held WHERE held.id = p_held
            UNION ALL
            SELECT others.id, others.task_id FROM others
        )
        SELECT array_agg(p.id ORDER BY p.id) INTO v_steps FROM picked AS p
        WHERE p.task_id = (SELECT first.task_id FROM picked AS first ORDER BY first.id LIMIT 1);
        IF v_steps IS NULL THEN
            RETURN;
        END IF;
    END IF;
    IF p_run IS NOT NULL THEN
        -- One probe of the partial index step_claimable, as the pick above, past the
        -- steps picked (rows being claimed by others at this moment included).
        more := (
            SELECT other.id FROM runs_step AS other
            WHERE other.run_id >= p_run AND other.run_id <= p_run
              AND other.status = 'pending'
              AND other.dispatched_at IS NOT NULL
              AND (other.next_run_at IS NULL OR other.next_run_at <= p_now)
              AND other.id <> ALL (v_steps)
            ORDER BY other.run_id, other.id
            LIMIT 1
        ) IS NOT NULL;
    END IF;
    -- Each step by its key: as `s.id = ANY (v_steps)`, a generic plan made where the
    -- statistics said few steps were pending read every pending step through a partial
    -- index.
    FOREACH v_step IN ARRAY v_steps LOOP
        WITH claimed AS (
            UPDATE runs_step AS s
            SET status = 'running',
                -- The held step's release and dispatch (a ready step has no dependency
                -- left), in the claim's row version.
                pending_dependencies = CASE WHEN s.id = p_held THEN 0
                                            ELSE s.pending_dependencies END,
                dispatched_at = CASE WHEN s.id = p_held THEN p_now ELSE s.dispatched_at END,
                attempts = s.attempts + 1,
                -- A step that was parked (waiting_reason: a rate limit's line, a timer)
                -- starts now: started_at is the attempt's that runs the tool, and the
                -- time parked since it went back to pending is added to waited_ms.
                started_at = CASE WHEN s.waiting_reason <> '' THEN p_now
                                  ELSE COALESCE(s.started_at, p_now) END,
                waited_ms = s.waited_ms + CASE WHEN s.waiting_reason <> '' THEN
                    runs.duration_ms(p_now, s.status_changed_at, s.status_changed_at)
                    ELSE 0 END,
                status_changed_at = p_now,
                lease_expires_at = p_now + make_interval(secs => p_lease),
                next_run_at = NULL,
                worker = p_worker,
                celery_task_id = p_task_id,
                -- Its event, on its row (runs.run_history): no event row written.
                claim_event = nextval('runs_runevent_id_seq'),
                claimed_at = p_now
            WHERE s.id = v_step
              AND s.status = 'pending'
              AND (s.dispatched_at IS NOT NULL OR s.id = p_held)
              AND (s.next_run_at IS NULL OR s.next_run_at <= p_now)
              -- The run by its key: as a join, a generic plan made while few runs were
              -- running scanned every running run for it.
              AND (SELECT r.status FROM runs_run AS r WHERE r.id = s.run_id) = 'running'
            RETURNING s.*
        )
        SELECT c.id, c.run_id, c.attempt_number, c.attempts, c.task_id, c.generation,
               c.name, c.tool, c.params, c."when", c.timeout_ms, c.handler_for_id,
               c.dispatched_at, c.status_changed_at, c.rate_limits, c.reused_from, c.cache
        INTO id, run_id, attempt_number, attempts, task_id, generation, name, tool, params,
             "when", timeout_ms, handler_for_id, dispatched_at, status_changed_at,
             rate_limits, reused_from, cache
        FROM claimed AS c;
        CONTINUE WHEN NOT FOUND;
        IF p_run IS NULL THEN
            -- A step given by its key: the probe for its run, now that it is running.
            more := (
                SELECT other.id FROM runs_step AS other
                WHERE other.run_id >= step_claim.run_id AND other.run_id <= step_claim.run_id
                  AND other.status = 'pending'
                  AND other.dispatched_at IS NOT NULL
                  AND (other.next_run_at IS NULL OR other.next_run_at <= p_now)
                ORDER BY other.run_id, other.id
                LIMIT 1
            ) IS NOT NULL;
        END IF;
        RETURN NEXT;
    END LOOP;
END
$$;

-- runs.step_claimed_next: whether the next claim of the run `p_run` (runs.step_claim,
-- at `p_now`) would take `p_step`, a step the caller has just made ready, were it
-- dispatched: no claimable step of the run comes before it. The claim's own pick, but
-- rows being claimed by others at this moment count (where one is, the caller
-- dispatches the step as any other, and the claim picks as it does).
CREATE FUNCTION runs.step_claimed_next(p_run uuid, p_step bigint, p_now timestamptz)
RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    RETURN COALESCE((
        SELECT s.id FROM runs_step AS s
        WHERE s.run_id >= p_run AND s.run_id <= p_run
          AND s.status = 'pending'
          AND s.dispatched_at IS NOT NULL
          AND (s.next_run_at IS NULL OR s.next_run_at <= p_now)
        ORDER BY s.run_id, s.id
        LIMIT 1
    ) > p_step, true);
END
$$;
