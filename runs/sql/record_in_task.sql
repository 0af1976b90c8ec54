-- runs.record_in_task: a step completed while its task has other children open.
--
-- A shape of runs.step_completed, which holds the step's and the task's rows locked.
-- The step completes (runs.step_finish), its successors in the task are released, and
-- what became ready is dispatched up to the task's free slots, as the general path
-- (runs.engine.outcomes, runs.engine.dispatch) would. Returns the steps it dispatched
-- (the columns runs.engine.dispatch.step_from_row takes), or one row of NULLs when it
-- dispatched none; no row when it declined, having written nothing: the task is not
-- RUNNING, an approval would be dispatched (the general path's: there the run may stop to
-- wait for it), or the reservation cannot pay the step's charge (the general path fails
-- the step with budget_exhausted).
--
-- With `p_claim` (the worker's claim of the run's next step follows in this transaction),
-- the first step it makes ready is left undispatched when that claim would take it
-- (runs.step_claimed_next), and returned `held`: the claim releases, dispatches and
-- claims it in one row version (runs.step_claim's `p_held`).
CREATE FUNCTION runs.record_in_task(
    p_step bigint, p_attempt integer, p_task bigint, p_output text, p_cost numeric,
    p_cost_text text, p_amount numeric, p_now timestamptz, p_claim boolean DEFAULT false
) RETURNS TABLE (
    id bigint, tool varchar, timeout_ms bigint, run_id uuid, attempt_number smallint,
    status varchar, held boolean
) LANGUAGE plpgsql
-- One plan per statement, made once per session for any step: their conditions are keys
-- and ids, and PostgreSQL would otherwise plan a statement given a list of ids anew on
-- every call (a plan for the list it is given looks cheaper than one for any list).
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    v_generation smallint;
    v_free integer;
    v_dependents jsonb;
    v_run uuid;
    v_attempt_number smallint;
    v_released bigint[];
    v_ready bigint[];
    v_approval boolean;
    v_held bigint;
BEGIN
    -- Read before anything is written: the task, with the slots the step frees...
    SELECT t.retry_count, runs.free_places(t.max_concurrent_steps, t.active_children - 1),
           s.dependents, s.run_id, s.attempt_number
      INTO v_generation, v_free, v_dependents, v_run, v_attempt_number
      FROM runs_task AS t JOIN runs_step AS s ON s.task_id = t.id
     WHERE s.id = p_step AND t.id = p_task AND t.status = 'running';
    IF NOT FOUND THEN
        RETURN;
    END IF;
    -- ...the successors it releases...
    v_released := CASE WHEN v_dependents = '[]'::jsonb THEN '{}'
                       ELSE runs.task_steps_named(p_task, v_generation, v_dependents) END;
    -- ...and what becomes ready: those left with no dependency, and the steps already
    -- ready but held by the concurrency limit (the partial index step_ready holds exactly
    -- these, so a wide task costs what a narrow one does), first ones first, up to the
    -- free slots.
    SELECT COALESCE(array_agg(ready.id ORDER BY ready.position), '{}'),
           COALESCE(bool_or(ready.tool = 'approval'), false)
      INTO v_ready, v_approval
      FROM (
          SELECT candidate.id, candidate.position, candidate.tool
          FROM (
              SELECT st.id, st.position, st.tool
              FROM unnest(v_released) AS released (id)
              CROSS JOIN LATERAL (
                  SELECT * FROM runs_step WHERE id = released.id
                  OFFSET 0  -- by its key: not through an index of every pending step
              ) AS st
              WHERE st.pending_dependencies = 1 AND st.status = 'pending'
                AND st.dispatched_at IS NULL
              UNION
              (SELECT st.id, st.position, st.tool FROM runs_step AS st
               WHERE st.task_id = p_task AND st.generation = v_generation
                 AND st.status = 'pending' AND st.pending_dependencies = 0
                 AND st.dispatched_at IS NULL
               ORDER BY st.position
               LIMIT v_free)
          ) AS candidate
          ORDER BY candidate.position
          LIMIT v_free
      ) AS ready;
    IF v_approval THEN
        RETURN;
    END IF;
    IF p_amount > 0 AND NOT billing.credits_charge(v_run, v_attempt_number, p_amount) THEN
        RETURN;
    END IF;
    PERFORM runs.step_finish(p_step, p_attempt, p_output, p_cost, p_cost_text, p_now);
    UPDATE runs_task
    SET open_children = open_children - 1,
        active_children = active_children - 1 + cardinality(v_ready)
    WHERE id = p_task;
    IF p_claim AND v_ready <> '{}' THEN
        v_held := (SELECT min(ready.id) FROM unnest(v_ready) AS ready (id));  -- claim order
        IF NOT runs.step_claimed_next(v_run, v_held, p_now) THEN
            v_held := NULL;
        END IF;
    END IF;
    -- The successors released and the ready steps dispatched, each row updated once (a
    -- step both released and dispatched is one new row version, not two), the held one
    -- by its claim.
    RETURN QUERY
    WITH moved AS (
        UPDATE runs_step AS st
        SET pending_dependencies = st.pending_dependencies - (st.id = ANY (v_released))::int,
            dispatched_at = CASE WHEN st.id = ANY (v_ready) THEN p_now ELSE st.dispatched_at END
        WHERE st.id = ANY (v_released || v_ready) AND st.id IS DISTINCT FROM v_held
        RETURNING st.id, st.tool, st.timeout_ms, st.run_id, st.attempt_number, st.status,
                  st.position, st.id = ANY (v_ready) AS dispatched
    ), listed AS (
        SELECT moved.id, moved.tool, moved.timeout_ms, moved.run_id, moved.attempt_number,
               moved.status, moved.position, false AS held
        FROM moved WHERE moved.dispatched
        UNION ALL
        SELECT h.id, h.tool, h.timeout_ms, h.run_id, h.attempt_number, h.status, h.position,
               true
        FROM runs_step AS h WHERE h.id = v_held
    )
    SELECT listed.id, listed.tool, listed.timeout_ms, listed.run_id, listed.attempt_number,
           listed.status, listed.held
    FROM (VALUES (1)) AS recorded LEFT JOIN listed ON true
    ORDER BY listed.position;
END
$$;
