-- runs.record_last_in_run: a step completed that was its run's last open work.
--
-- A shape of runs.step_completed, which holds the step's, the task's, the agent's and
-- the run's rows locked. Only when nothing else is open at any level: the task's last
-- open step, the agent's last open task, every other agent of the attempt completed or
-- skipped, the run RUNNING with no approval waiting. The step completes
-- (runs.step_finish), its task (runs.task_finish), its agent, and the run with its
-- attempt closed (runs.run_finish, as runs.services.run_complete after the general
-- path's propagation; the step's charge drawn first). The dependents each level
-- releases are all finished already (they would be open otherwise), but their counts are
-- released as the general path releases them. Events in the general path's
-- order: step, task, agent, run, then the refund. Returns one row of NULLs when it
-- recorded; no row when it declined, having written nothing (a level not in that state,
-- or a charge the reservation cannot pay).
CREATE FUNCTION runs.record_last_in_run(
    p_step bigint, p_attempt integer, p_task bigint, p_agent bigint, p_run uuid,
    p_output text, p_cost numeric, p_cost_text text, p_amount numeric, p_now timestamptz
) RETURNS TABLE (
    id bigint, tool varchar, timeout_ms bigint, run_id uuid, attempt_number smallint,
    status varchar
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
    v_attempt_number smallint;
    v_agent_generation integer;
    v_agent_dependents jsonb;
    v_last_heartbeat timestamptz;
BEGIN
    SELECT t.retry_count, t.dependents, s.dependents, s.attempt_number
      INTO v_task_generation, v_task_dependents, v_step_dependents, v_attempt_number
      FROM runs_task AS t JOIN runs_step AS s ON s.task_id = t.id
     WHERE s.id = p_step AND t.id = p_task AND t.status = 'running' AND t.open_children = 1;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    SELECT a.retry_count, a.dependents INTO v_agent_generation, v_agent_dependents
      FROM runs_agent AS a
     WHERE a.id = p_agent AND a.status = 'running' AND a.open_children = 1
       AND NOT EXISTS (
           SELECT 1 FROM runs_agent AS other
           WHERE other.run_id = a.run_id AND other.attempt_number = a.attempt_number
             AND other.id <> a.id AND other.status NOT IN ('completed', 'skipped')
       );
    IF NOT FOUND THEN
        RETURN;
    END IF;
    SELECT r.last_heartbeat INTO v_last_heartbeat FROM runs_run AS r
     WHERE r.id = p_run AND r.status = 'running' AND r.open_children = 1
       AND r.waiting_approvals = 0;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF p_amount > 0 AND NOT billing.credits_charge(p_run, v_attempt_number, p_amount) THEN
        RETURN;
    END IF;
    PERFORM runs.step_finish(p_step, p_attempt, p_output, p_cost, p_cost_text, p_now);
    IF v_step_dependents <> '[]'::jsonb THEN
        UPDATE runs_step SET pending_dependencies = pending_dependencies - 1
        WHERE id = ANY (runs.task_steps_named(p_task, v_task_generation, v_step_dependents));
    END IF;
    PERFORM runs.task_finish(p_task, p_now);
    IF v_task_dependents <> '[]'::jsonb THEN
        UPDATE runs_task SET pending_dependencies = pending_dependencies - 1
        WHERE id = ANY (runs.agent_tasks_named(p_agent, v_agent_generation,
                                                 v_task_dependents));
    END IF;
    -- The agent, as runs.task_finish completes a task.
    UPDATE runs_agent AS a
    SET status = 'completed',
        status_changed_at = p_now,
        completed_at = p_now,
        duration_ms = runs.duration_ms(p_now, a.started_at, a.created_at),
        open_children = a.open_children - 1,
        active_children = a.active_children - 1
    WHERE a.id = p_agent;
    PERFORM runs.run_event(p_run, v_attempt_number, 'agent', p_agent::text, 'transition',
                             'running', 'completed', 'system', p_now);
    UPDATE runs_agent SET pending_dependencies = pending_dependencies - 1
    WHERE run_id = p_run AND attempt_number = v_attempt_number
      AND name IN (SELECT jsonb_array_elements_text(v_agent_dependents));
    PERFORM runs.run_heartbeat(p_run, v_last_heartbeat, p_now);
    PERFORM runs.run_finish(p_run, v_attempt_number, 1, 'engine', p_now);
    RETURN QUERY SELECT NULL::bigint, NULL::varchar, NULL::bigint, NULL::uuid,
                        NULL::smallint, NULL::varchar;
END
$$;
