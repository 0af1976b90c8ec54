-- runs.step_completed: a worker's step attempt completed; record it and move the run on.
--
-- The engine's hot path (docs/engine.md, "The path of one step"). Most outcomes are the
-- plainest case: the attempt succeeded, the step is no on_error handler, and nothing
-- above its agent changes. This records such a completion inside PostgreSQL, as one call
-- in its own transaction (runs.engine.hotpath.complete): the locks, the choice of shape
-- from the counts read under them, the shape's writes and the commit, with no round trip
-- to the worker while a lock is held. Each shape changes exactly what the general path
-- (runs.engine.outcomes) would: same columns, same events in the same order, same
-- counters, same choice of work to dispatch; and only when it is sure to. Otherwise
-- nothing is written and no row returned: the caller takes the general path.
--
-- With `a_claim`, the worker's next step is claimed in the same call (runs.step_claim):
-- of this run, or, with `a_choose`, of the run its fair choice gives (runs.run_choose:
-- `a_me`, `a_full`, `a_skip` are that choice's terms, `a_held` the organization of the
-- slot the worker holds); up to `a_batch` of this run's next steps at once (a batch,
-- docs/engine.md, "Batches").
--
-- Rows returned, by `o_shape`:
--   'chosen'   the fair choice made (first, when asked): o_run_id, o_priority, and in
--              o_claimed {organization_id, pickup, busy};
--   'leaf', 'in_task', 'last_in_task', 'last_in_run'
--              what was recorded: o_done is the step, and each row one step dispatched
--              (o_id .. o_status; NULL when none), to announce at o_priority;
--   'claimed'  a step claimed for the worker (one row each, in plan order), in o_claimed
--              (runs.step_claim's row as JSON, with `waited`: the seconds the recording
--              waited for its locks);
--   'waited'   without `a_claim`: o_claimed is {waited} alone.
--
-- Locks, always in this order: the run's gate, shared (other recordings of the run go on
-- beside this one; anything else that changes the run holds it exclusively:
-- runs.transitions.lock_gate); the step's row; then each level's row whose counters
-- change: the task's, the agent's when the task ends, the run's when the agent ends.
-- Each level's counts are read after its lock is granted, so they see every earlier
-- holder's commit.
CREATE FUNCTION runs.step_completed(
    a_step bigint, a_attempt integer, a_run uuid, a_output text, a_cost numeric,
    a_cost_text text, a_amount numeric, a_claim boolean, a_worker text, a_task_id text,
    a_lease float8, a_choose boolean, a_me text, a_full uuid[], a_skip uuid[], a_held uuid,
    a_batch integer DEFAULT 1
) RETURNS TABLE (
    o_shape text, o_priority smallint, o_done bigint, o_id bigint, o_tool varchar,
    o_timeout_ms bigint, o_run_id uuid, o_attempt_number smallint, o_status varchar,
    o_claimed jsonb
) LANGUAGE plpgsql AS $$
DECLARE
    v_status text;
    v_waiting integer;
    v_priority smallint;
    v_heartbeat timestamptz;
    v_task bigint;
    v_agent bigint;
    v_attempt_number smallint;
    v_leaf boolean;
    v_open integer;
    v_claim_run uuid;
    v_chosen record;
    v_shape text;
    v_now timestamptz;
    v_locking timestamptz;
    v_locked timestamptz;
    v_claimed jsonb;
    v_row record;
    v_held bigint;
BEGIN
    PERFORM runs.run_gate(a_run, p_shared => true);
    SELECT r.status, r.waiting_approvals, r.last_heartbeat, r.priority
      INTO v_status, v_waiting, v_heartbeat, v_priority
      FROM runs_run AS r WHERE r.id = a_run;
    IF NOT FOUND OR v_status <> 'running' OR v_waiting > 0 THEN
        RETURN;
    END IF;
    -- The step, running this attempt (only an exclusive holder of the gate changes a
    -- running step, and none is in), and no on_error handler; and whether it is a leaf
    -- (below). Its row is locked before any other row (the first statement of the leaf's
    -- block, or before the shapes'): a claim may hold it (a lock that outlived the
    -- claim's recheck), and such a claim may be waiting for a task's row; so no
    -- recording waits for its own step while it holds one. Not here: a row locked
    -- before the leaf's block and updated inside it takes a MultiXact (to PostgreSQL the
    -- block is a transaction of its own, and the row must keep both).
    SELECT s.task_id, t.agent_id, s.attempt_number,
           s.dependents = '[]'::jsonb AND t.max_concurrent_steps >= t.step_count
           AND t.open_children > 1 AND t.status = 'running'
      INTO v_task, v_agent, v_attempt_number, v_leaf
      FROM runs_step AS s JOIN runs_task AS t ON t.id = s.task_id
     WHERE s.id = a_step AND s.run_id = a_run AND s.status = 'running'
       AND s.attempts = a_attempt AND s.handler_for_id IS NULL;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    -- The worker's fair choice, when its slice is over (runs.admission.fairness), made before any
    -- row lock is taken (it takes none) and returned whatever it is (with nothing
    -- recorded, when a duplicate of this recording recorded the step meanwhile: the
    -- worker then drops its result and the choice). The step claimed below is of
    -- the chosen run when that run is of the worker's slot's organization and running;
    -- none when it is another organization's or a pick-up (the worker goes there); of
    -- this run when nothing was ready (what this recording makes ready may be).
    IF a_claim THEN
        v_claim_run := a_run;
        IF a_choose THEN
            SELECT * INTO v_chosen FROM runs.run_choose(a_me, a_full, a_skip);
            RETURN QUERY SELECT 'chosen'::text, v_chosen.priority, NULL::bigint, NULL::bigint,
                NULL::varchar, NULL::bigint, v_chosen.run_id, NULL::smallint, NULL::varchar,
                jsonb_build_object('organization_id', v_chosen.organization_id,
                                   'pickup', v_chosen.pickup, 'busy', v_chosen.busy);
            IF v_chosen.run_id IS NOT NULL THEN
                v_claim_run := CASE WHEN NOT v_chosen.pickup
                                         AND v_chosen.organization_id = a_held
                                    THEN v_chosen.run_id END;
            END IF;
        END IF;
    END IF;

    -- A leaf of a task whose steps all run at once (no dependents, the task's limit at
    -- least its step count, so every step was dispatched when the task started and none
    -- waits for a slot): its completion releases and dispatches nothing, only the task's
    -- two counters change. So the step completes and the worker's next step is claimed
    -- before the task's row is locked, and that lock is taken last, for the counters and
    -- the charge alone: the recordings of a fan-out's leaves overlap instead of queueing
    -- behind one row (docs/engine.md, "A wide task's leaves"). The task's last leaf finds
    -- one child open there, and a charge the reservation cannot pay is refused: the block
    -- is then rolled back, its writes and row locks with it, and the shapes below record
    -- the step (or decline).
    IF v_leaf THEN
        v_now := clock_timestamp();
        BEGIN
            PERFORM 1 FROM runs_step
             WHERE id = a_step AND status = 'running' AND attempts = a_attempt
               FOR NO KEY UPDATE;
            IF NOT FOUND THEN  -- recorded meanwhile: the lock below finds it so too
                RAISE EXCEPTION USING ERRCODE = 'OEL01';
            END IF;
            PERFORM runs.step_finish(a_step, a_attempt, a_output, a_cost, a_cost_text, v_now);
            IF v_claim_run IS NOT NULL THEN
                v_claimed := (SELECT jsonb_agg(to_jsonb(c)) FROM runs.step_claim(
                    NULL, v_claim_run, a_worker, a_task_id, a_lease, v_now, a_batch) AS c);
            END IF;
            v_locking := clock_timestamp();
            UPDATE runs_task
               SET open_children = open_children - 1, active_children = active_children - 1
             WHERE id = v_task AND status = 'running' AND open_children > 1;
            IF NOT FOUND THEN
                RAISE EXCEPTION USING ERRCODE = 'OEL01';
            END IF;
            v_locked := clock_timestamp();
            IF a_amount > 0
               AND NOT billing.credits_charge(a_run, v_attempt_number, a_amount) THEN
                RAISE EXCEPTION USING ERRCODE = 'OEL01';
            END IF;
            v_shape := 'leaf';
        EXCEPTION WHEN SQLSTATE 'OEL01' THEN
            v_claimed := NULL;
        END;
    END IF;

    -- Any other completion: each level's row locked before its counts are read and its
    -- shape runs: the task's; the agent's when the task ends; the run's when the agent
    -- ends. A shape that declines writes nothing and the call returns nothing more.
    IF v_shape IS NULL THEN
        v_locking := clock_timestamp();  -- the wait for the locks goes back to the worker
        PERFORM 1 FROM runs_step
         WHERE id = a_step AND status = 'running' AND attempts = a_attempt
           FOR NO KEY UPDATE;
        IF NOT FOUND THEN
            RETURN;  -- recorded by another call meanwhile (a duplicate of the recording)
        END IF;
        SELECT open_children INTO v_open FROM runs_task WHERE id = v_task FOR NO KEY UPDATE;
        -- The two shapes that dispatch: the first step made ready may be held for the
        -- worker's claim below, which dispatches and claims it in one row version.
        IF v_open > 1 THEN
            v_shape := 'in_task';
            v_now := clock_timestamp();  -- as the general path's, once its locks are held
            FOR v_row IN SELECT * FROM runs.record_in_task(
                a_step, a_attempt, v_task, a_output, a_cost, a_cost_text, a_amount, v_now,
                v_claim_run IS NOT DISTINCT FROM a_run) LOOP
                v_held := CASE WHEN v_row.held THEN v_row.id ELSE v_held END;
                RETURN QUERY SELECT v_shape, v_priority, a_step, v_row.id, v_row.tool,
                    v_row.timeout_ms, v_row.run_id, v_row.attempt_number, v_row.status,
                    NULL::jsonb;
            END LOOP;
        ELSE
            SELECT open_children INTO v_open FROM runs_agent WHERE id = v_agent
               FOR NO KEY UPDATE;
            IF v_open > 1 THEN
                v_shape := 'last_in_task';
                v_now := clock_timestamp();
                FOR v_row IN SELECT * FROM runs.record_last_in_task(
                    a_step, a_attempt, v_task, v_agent, a_output, a_cost, a_cost_text,
                    a_amount, v_now, v_claim_run IS NOT DISTINCT FROM a_run) LOOP
                    v_held := CASE WHEN v_row.held THEN v_row.id ELSE v_held END;
                    RETURN QUERY SELECT v_shape, v_priority, a_step, v_row.id, v_row.tool,
                        v_row.timeout_ms, v_row.run_id, v_row.attempt_number, v_row.status,
                        NULL::jsonb;
                END LOOP;
            ELSE
                SELECT open_children INTO v_open FROM runs_run WHERE id = a_run
                   FOR NO KEY UPDATE;
                IF v_open <> 1 THEN
                    RETURN;
                END IF;
                v_now := clock_timestamp();
                -- The run completes: no step of it is left to claim, and its row is
                -- written there, heartbeat included.
                RETURN QUERY SELECT 'last_in_run'::text, v_priority, a_step, d.*, NULL::jsonb
                    FROM runs.record_last_in_run(a_step, a_attempt, v_task, v_agent, a_run,
                                                   a_output, a_cost, a_cost_text, a_amount,
                                                   v_now) AS d;
                RETURN;
            END IF;
        END IF;
        IF NOT FOUND THEN
            RETURN;  -- declined
        END IF;
        v_locked := v_now;
        -- The worker's next step, claimed after the recording (what it made ready may be
        -- that step: the next of a sequence, a dag's next node) and under its row locks:
        -- a claim takes a row lock that may outlive a row its recheck turned down (a step
        -- another worker's claim has just taken), and a claim made before the task's lock
        -- was taken held such a step while its own worker, recording it, waited behind
        -- that lock: a deadlock.
        IF v_claim_run IS NOT NULL THEN
            v_claimed := (SELECT jsonb_agg(to_jsonb(c)) FROM runs.step_claim(
                NULL, v_claim_run, a_worker, a_task_id, a_lease, v_now, a_batch, v_held) AS c);
            IF v_held IS NOT NULL AND (v_claimed -> 0 ->> 'id')::bigint IS DISTINCT FROM v_held
            THEN
                -- Left undispatched for this claim alone: nothing else may take it.
                RAISE EXCEPTION 'step % was held for its claim and not claimed', v_held;
            END IF;
        END IF;
    ELSE
        RETURN QUERY SELECT v_shape, v_priority, a_step, NULL::bigint, NULL::varchar,
            NULL::bigint, NULL::uuid, NULL::smallint, NULL::varchar, NULL::jsonb;
    END IF;
    IF v_claimed IS NOT NULL THEN
        RETURN QUERY SELECT 'claimed'::text, NULL::smallint, NULL::bigint, NULL::bigint,
            NULL::varchar, NULL::bigint, NULL::uuid, NULL::smallint, NULL::varchar,
            c.value || jsonb_build_object('waited', EXTRACT(EPOCH FROM v_locked - v_locking))
            FROM jsonb_array_elements(v_claimed) AS c;  -- as claimed: the first is started next
    ELSIF NOT a_claim THEN
        -- No claim asked (a worker with a batch's steps in hand): the wait alone.
        RETURN QUERY SELECT 'waited'::text, NULL::smallint, NULL::bigint, NULL::bigint,
            NULL::varchar, NULL::bigint, NULL::uuid, NULL::smallint, NULL::varchar,
            jsonb_build_object('waited', EXTRACT(EPOCH FROM v_locked - v_locking));
    END IF;
    -- The run's heartbeat, last: its row is locked only from here to the commit.
    PERFORM runs.run_heartbeat(a_run, v_heartbeat, v_now);
END
$$;
