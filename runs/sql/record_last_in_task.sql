-- runs.record_last_in_task: a step completed that was its task's last open child,
-- while the task's agent has other children open.
--
-- A shape of runs.step_completed, which holds the step's, the task's and the agent's
-- rows locked. The step completes (runs.step_finish), then its task
-- (runs.task_finish); one level up the same again: the task's successors among the
-- agent's tasks released, the agent's ready tasks started up to its free slots, and each
-- started task's ready steps dispatched up to that task's own limit. Events in the
-- general path's order: the step, the task, then the started tasks by id. Returns the
-- steps it dispatched (by task, then step, in plan order), or one row of NULLs when it
-- dispatched none; no row when it declined, having written nothing: the task or the
-- agent is not RUNNING, an approval would be dispatched (the general path's: there the
-- run may stop to wait for it before the next task dispatches), or the reservation
-- cannot pay the step's charge. With `p_claim`, the first step it dispatches may be
-- left to the claim that follows, as runs.record_in_task leaves it (`held`).
CREATE FUNCTION runs.record_last_in_task(
    p_step bigint, p_attempt integer, p_task bigint, p_agent bigint, p_output text,
    p_cost numeric, p_cost_text text, p_amount numeric, p_now timestamptz,
    p_claim boolean DEFAULT false
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
    v_task_generation smallint;
    v_task_dependents jsonb;
    v_step_dependents jsonb;
    v_run uuid;
    v_attempt_number smallint;
    v_agent_generation integer;
    v_free integer;
    v_released bigint[];
    v_ready bigint[];
    v_steps bigint[];
    v_approval boolean;
    v_held bigint;
BEGIN
    -- Read before anything is written: the task and its agent, with the slots the task
    -- frees...
    SELECT t.retry_count, t.dependents, s.dependents, s.run_id, s.attempt_number
      INTO v_task_generation, v_task_dependents, v_step_dependents, v_run, v_attempt_number
      FROM runs_task AS t JOIN runs_step AS s ON s.task_id = t.id
     WHERE s.id = p_step AND t.id = p_task AND t.status = 'running' AND t.open_children = 1;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    SELECT a.retry_count, runs.free_places(a.max_concurrent_tasks, a.active_children - 1)
      INTO v_agent_generation, v_free
      FROM runs_agent AS a
     WHERE a.id = p_agent AND a.status = 'running' AND a.open_children > 1;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    -- ...the agent's tasks it releases...
    v_released := runs.agent_tasks_named(p_agent, v_agent_generation, v_task_dependents);
    -- ...the tasks that become ready: those left with no dependency, and the tasks
    -- already ready but held by the agent's limit, first ones first, up to its free
    -- slots...
    v_ready := ARRAY(
        SELECT candidate.id
        FROM (
            SELECT tk.id, tk.position
            FROM unnest(v_released) AS released (id)
            CROSS JOIN LATERAL (
                SELECT * FROM runs_task WHERE id = released.id
                OFFSET 0  -- by its key
            ) AS tk
            WHERE tk.pending_dependencies = 1 AND tk.status = 'pending'
              AND tk.dispatched_at IS NULL
            UNION
            (SELECT tk.id, tk.position FROM runs_task AS tk
             WHERE tk.agent_id = p_agent AND tk.generation = v_agent_generation
               AND tk.status = 'pending' AND tk.pending_dependencies = 0
               AND tk.dispatched_at IS NULL
             ORDER BY tk.position
             LIMIT v_free)
        ) AS candidate
        ORDER BY candidate.position
        LIMIT v_free
    );
    -- ...and each ready task's first steps, up to its own limit, looked up by its id.
    SELECT COALESCE(array_agg(st.id), '{}'), COALESCE(bool_or(st.tool = 'approval'), false)
      INTO v_steps, v_approval
      FROM runs_task AS tk
      CROSS JOIN LATERAL (
          SELECT s.id, s.tool FROM runs_step AS s
          WHERE s.task_id = tk.id AND s.generation = tk.retry_count
            AND s.status = 'pending' AND s.pending_dependencies = 0
            AND s.dispatched_at IS NULL
          ORDER BY s.position
          LIMIT runs.free_places(tk.max_concurrent_steps, tk.active_children)
      ) AS st
     WHERE tk.id = ANY (v_ready);
    IF v_approval THEN
        RETURN;
    END IF;
    IF p_amount > 0 AND NOT billing.credits_charge(v_run, v_attempt_number, p_amount) THEN
        RETURN;
    END IF;
    PERFORM runs.step_finish(p_step, p_attempt, p_output, p_cost, p_cost_text, p_now);
    IF v_step_dependents <> '[]'::jsonb THEN
        UPDATE runs_step SET pending_dependencies = pending_dependencies - 1
        WHERE id = ANY (runs.task_steps_named(p_task, v_task_generation, v_step_dependents));
    END IF;
    PERFORM runs.task_finish(p_task, p_now);
    -- The agent's tasks released and the ready ones started, each row updated once.
    UPDATE runs_task AS tk
    SET pending_dependencies = tk.pending_dependencies - (tk.id = ANY (v_released))::int,
        status = CASE WHEN tk.id = ANY (v_ready) THEN 'running' ELSE tk.status END,
        status_changed_at = CASE WHEN tk.id = ANY (v_ready) THEN p_now
                                 ELSE tk.status_changed_at END,
        started_at = CASE WHEN tk.id = ANY (v_ready) THEN COALESCE(tk.started_at, p_now)
                          ELSE tk.started_at END,
        dispatched_at = CASE WHEN tk.id = ANY (v_ready) THEN p_now ELSE tk.dispatched_at END,
        active_children = tk.active_children + (
            SELECT count(*) FROM runs_step AS s WHERE s.id = ANY (v_steps) AND s.task_id = tk.id)
    WHERE tk.id = ANY (v_released || v_ready);
    INSERT INTO runs_runevent
        (run_id, attempt_number, entity, entity_id, kind, from_status, to_status, actor,
         message, payload, created_at)
    SELECT tk.run_id, tk.attempt_number, 'task', tk.id::text, 'transition', 'pending',
           'running', 'system', '', '{}'::jsonb, p_now
    FROM runs_task AS tk WHERE tk.id = ANY (v_ready)
    ORDER BY tk.id;
    UPDATE runs_agent
    SET open_children = open_children - 1,
        active_children = active_children - 1 + cardinality(v_ready)
    WHERE id = p_agent;
    IF p_claim AND v_steps <> '{}' THEN
        v_held := (SELECT min(ready.id) FROM unnest(v_steps) AS ready (id));  -- claim order
        IF NOT runs.step_claimed_next(v_run, v_held, p_now) THEN
            v_held := NULL;
        END IF;
    END IF;
    RETURN QUERY
    WITH moved AS (
        UPDATE runs_step AS st SET dispatched_at = p_now
        WHERE st.id = ANY (v_steps) AND st.id IS DISTINCT FROM v_held
        RETURNING st.id, st.tool, st.timeout_ms, st.run_id, st.attempt_number, st.status,
                  st.task_id, st.position, false AS held
    ), listed AS (
        SELECT * FROM moved
        UNION ALL
        SELECT h.id, h.tool, h.timeout_ms, h.run_id, h.attempt_number, h.status, h.task_id,
               h.position, true
        FROM runs_step AS h WHERE h.id = v_held
    )
    SELECT listed.id, listed.tool, listed.timeout_ms, listed.run_id, listed.attempt_number,
           listed.status, listed.held
    FROM (VALUES (1)) AS recorded
    LEFT JOIN (listed JOIN runs_task AS tk ON tk.id = listed.task_id) ON true
    ORDER BY tk.position, listed.position;
END
$$;
