-- runs.run_admission: what admission weighs at a run's start (runs.admission.run_admission:
-- on_start decides, looks_free guesses), in one statement.
--
-- Counts the organization's top-level runs under way, the run itself left out: those
-- waiting to start (PENDING), those holding a place (started, or admitted and not yet
-- picked up: RUNNING, waiting for an approval, PAUSED, RESUMING, ESCALATED, or PENDING
-- or RETRYING with admitted_at set; runs.admission.run_admission.HOLDS_A_PLACE says the same for the
-- ORM's queries) and, for a run with a concurrency key, those of its key holding one;
-- whether any run waits for a place (PENDING or RETRYING, not admitted); and the
-- organization's limits, its own or the defaults given. `p_lock`: the advisory lock
-- namespace to serialise the organization's decisions in, taken first and held to the
-- transaction's end (on_start); NULL: no lock (looks_free). The counts are read after
-- the lock is granted (a statement of its own, with its own snapshot: what a start that
-- held the lock before committed is counted).
CREATE FUNCTION runs.run_admission(
    p_organization uuid, p_run uuid, p_key text, p_pending_default integer,
    p_running_default integer, p_lock integer
) RETURNS TABLE (
    pending_limit integer, pending bigint, running_limit integer, held bigint,
    waiting boolean, key_held bigint
) LANGUAGE plpgsql AS $$
BEGIN
    IF p_lock IS NOT NULL THEN
        PERFORM pg_advisory_xact_lock(p_lock, hashtext(p_organization::text));
    END IF;
    RETURN QUERY
    WITH under_way AS (
        SELECT r.status, r.concurrency_key,
               r.status IN ('running', 'waiting_approval', 'paused', 'resuming', 'escalated')
               OR (r.status IN ('pending', 'retrying') AND r.admitted_at IS NOT NULL)
                   AS holds
        FROM runs_run AS r
        WHERE r.organization_id = p_organization AND r.parent_run_id IS NULL
          AND r.id <> p_run
          AND r.status IN ('pending', 'retrying', 'running', 'waiting_approval', 'paused',
                           'resuming', 'escalated')
    )
    SELECT COALESCE(o.max_pending_runs, p_pending_default),
           (SELECT count(*) FROM under_way WHERE status = 'pending'),
           COALESCE(o.max_running_runs, p_running_default),
           (SELECT count(*) FROM under_way WHERE holds),
           EXISTS (SELECT 1 FROM under_way WHERE NOT holds),
           (SELECT count(*) FROM under_way
            WHERE p_key <> '' AND concurrency_key = p_key AND holds)
    FROM billing_organization AS o
    WHERE o.id = p_organization;
END
$$;
