-- runs.steps_hand_back: steps a worker claimed in a batch and will not start, given back.
--
-- A server that claimed several of a run's steps at once (runs.step_claim's batch)
-- runs them in turn; those it will not start (it stops serving: its burst spent, the run
-- no longer RUNNING, its result dropped; or they waited too long behind a slow step:
-- orchestrator.lease_keeper) go back to where the claim found them: PENDING, dispatched, so
-- claimable again, or PAUSED when the run is paused, as the lease sweep leaves a step it
-- reclaims (docs/engine.md, "Batches"). The attempt the claim counted never began and
-- charged nothing (a charge is written by the recording alone), so it is taken back: the
-- next claim gives the same number, and a step's retries are not spent by hand-backs.
--
-- `p_steps` and `p_attempts`: each step with the attempt it was claimed for; a step no
-- longer running that attempt (cancelled meanwhile, reclaimed by the lease sweep) is left
-- as it is. Under the run's gate, shared, as a recording: a pause or a cancel (which
-- close the gate) comes wholly before or wholly after, so a step is never left PENDING in
-- a paused run. Returns how many were made claimable (the caller rings for them).
CREATE FUNCTION runs.steps_hand_back(
    p_run uuid, p_steps bigint[], p_attempts integer[], p_actor text,
    p_now timestamptz DEFAULT now()
) RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    v_status text;
    v_to text;
    v_attempt_number smallint;
    v_claimable integer := 0;
BEGIN
    PERFORM runs.run_gate(p_run, p_shared => true);
    SELECT r.status INTO v_status FROM runs_run AS r WHERE r.id = p_run;
    v_to := CASE WHEN v_status = 'paused' THEN 'paused' ELSE 'pending' END;
    -- Step by step, each by its key (as a set, a generic plan may read every running
    -- step through the partial index step_running_lease, its conditions being these).
    FOR i IN 1 .. cardinality(p_steps) LOOP
        UPDATE runs_step AS s
        SET status = v_to,
            attempts = s.attempts - 1,
            started_at = CASE WHEN s.attempts = 1 THEN NULL ELSE s.started_at END,
            status_changed_at = p_now,
            lease_expires_at = NULL,
            worker = '',
            celery_task_id = '',
            -- Its claim forgotten with its worker and attempt: written as its event row
            -- by the update (runs.run_history).
            claim_event = NULL,
            claimed_at = NULL
        WHERE s.id = p_steps[i] AND s.run_id = p_run
          AND s.status = 'running' AND s.attempts = p_attempts[i]
        RETURNING s.attempt_number INTO v_attempt_number;
        CONTINUE WHEN NOT FOUND;
        -- As runs.transitions writes them: running -> pending, then pending -> paused.
        INSERT INTO runs_runevent
            (run_id, attempt_number, entity, entity_id, kind, from_status, to_status, actor,
             message, payload, created_at)
        SELECT p_run, v_attempt_number, 'step', p_steps[i]::text, 'transition', e.from_status,
               e.to_status, p_actor, e.message, jsonb_build_object('attempt', p_attempts[i]),
               p_now
        FROM (VALUES
            (1, 'running', 'pending', 'handed back unstarted'),
            (2, 'pending', 'paused', 'run is paused')
        ) AS e(n, from_status, to_status, message)
        WHERE e.n = 1 OR v_to = 'paused'
        ORDER BY e.n;
        IF v_status = 'running' THEN
            v_claimable := v_claimable + 1;
        END IF;
    END LOOP;
    RETURN v_claimable;
END
$$;
