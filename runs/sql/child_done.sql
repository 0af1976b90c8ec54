-- runs.child_done: a child finished for good (an agent, a task or a step: `p_entity`,
-- its id `p_child`); its parent counts it, and moves on.
--
-- The completion rule of every level, as the general path (runs.engine.outcomes,
-- failure, handlers, approvals) applies it after the child's own transition, in the
-- caller's transaction under the run's lock. The parent counts the child off (open, and
-- active when it was dispatched). Its dependents are released when it counts as a
-- success (COMPLETED, or a step's failure handled by on_error) or the parent is
-- sequential (which only orders its children); in a dag, work that needed
-- a child that did not succeed is SKIPPED instead, transitively, and counted off too.
-- When that was the parent's last open child the parent finishes, COMPLETED when one of
-- its children completed (a step's handled failure counts), else SKIPPED, and the same
-- goes on one level up; otherwise the parent's ready children are dispatched within its
-- free places (runs.agents_dispatch and the levels below). An on_error handler
-- (a step with handler_for_id) is counted off in its task; a completed one releases its
-- successors in its chain (then the task dispatches), a failed one skips them; the
-- caller then settles the step it handled.
--
-- Events, in order: the skipped dependents' (a wave at a time, by id), the parents
-- finished, then what was dispatched. Rows returned: one per step dispatched
-- (`o_kind` 'dispatched', runs.steps_dispatch's columns, in plan order), then one
-- `o_kind` 'ended' whose `o_status` names where the propagation stopped: 'task',
-- 'agent' (that parent goes on), 'run' (the run's agents were counted and dispatched:
-- the caller completes the run when none is open, runs.services.run_complete), or
-- 'handler' (the caller goes on with the handled step).
CREATE FUNCTION runs.child_done(
    p_entity text, p_child bigint, p_now timestamptz
) RETURNS TABLE (
    o_kind text, o_id bigint, o_tool varchar, o_timeout_ms bigint, o_run_id uuid,
    o_attempt_number smallint, o_status varchar
) LANGUAGE plpgsql AS $$
DECLARE
    v_entity text := p_entity;
    v_child bigint := p_child;
    v_success boolean;
    v_dispatched integer;
    v_name text;
    v_dependents jsonb;
    v_handler_for bigint;
    v_parent bigint;
    v_run uuid;
    v_open integer;
    v_mode text;
    v_generation integer;
    v_from text;
    v_to text;
BEGIN
    IF v_entity = 'step' THEN
        SELECT s.task_id, s.dependents, s.handler_for_id,
               s.status = 'completed' OR s.handled, (s.dispatched_at IS NOT NULL)::int
          INTO v_parent, v_dependents, v_handler_for, v_success, v_dispatched
          FROM runs_step AS s WHERE s.id = v_child;
        IF v_handler_for IS NOT NULL THEN
            UPDATE runs_task
            SET open_children = open_children - 1, active_children = active_children - 1
            WHERE id = v_parent;
            IF NOT v_success THEN
                -- The chain stops: its handlers still ahead are skipped and counted off.
                WITH skipped AS (
                    UPDATE runs_step AS s
                    SET status = 'skipped', status_changed_at = p_now, completed_at = p_now,
                        duration_ms = runs.duration_ms(p_now, s.started_at, s.created_at)
                    WHERE s.handler_for_id = v_handler_for AND s.status = 'pending'
                    RETURNING s.id, s.run_id, s.attempt_number, s.dispatched_at
                ), events AS (
                    INSERT INTO runs_runevent
                        (run_id, attempt_number, entity, entity_id, kind, from_status,
                         to_status, actor, message, payload, created_at)
                    SELECT sk.run_id, sk.attempt_number, 'step', sk.id::text, 'transition',
                           'pending', 'skipped', 'system',
                           'an earlier on_error handler failed', '{}'::jsonb, p_now
                    FROM skipped AS sk ORDER BY sk.id
                )
                UPDATE runs_task
                SET open_children = open_children - (
                    SELECT count(*) FROM skipped WHERE skipped.dispatched_at IS NULL)
                WHERE id = v_parent;
            ELSIF v_dependents <> '[]'::jsonb THEN
                UPDATE runs_step SET pending_dependencies = pending_dependencies - 1
                WHERE handler_for_id = v_handler_for
                  AND name IN (SELECT jsonb_array_elements_text(v_dependents));
                RETURN QUERY SELECT 'dispatched'::text, d.*
                    FROM runs.steps_dispatch(v_parent, p_now) AS d;
            END IF;
            RETURN QUERY SELECT 'ended'::text, NULL::bigint, NULL::varchar, NULL::bigint,
                NULL::uuid, NULL::smallint, 'handler'::varchar;
            RETURN;
        END IF;
    ELSIF v_entity = 'task' THEN
        SELECT t.status = 'completed', (t.dispatched_at IS NOT NULL)::int
          INTO v_success, v_dispatched
          FROM runs_task AS t WHERE t.id = v_child;
    ELSE
        SELECT a.status = 'completed', (a.dispatched_at IS NOT NULL)::int
          INTO v_success, v_dispatched
          FROM runs_agent AS a WHERE a.id = v_child;
    END IF;
    LOOP
        -- The child counted off in its parent.
        IF v_entity = 'step' THEN
            SELECT s.task_id, s.name, s.dependents INTO v_parent, v_name, v_dependents
              FROM runs_step AS s WHERE s.id = v_child;
            UPDATE runs_task AS t
            SET open_children = t.open_children - 1,
                active_children = t.active_children - v_dispatched
            WHERE t.id = v_parent
            RETURNING t.open_children, t.mode, t.retry_count, t.run_id
            INTO v_open, v_mode, v_generation, v_run;
        ELSIF v_entity = 'task' THEN
            SELECT t.agent_id, t.name, t.dependents INTO v_parent, v_name, v_dependents
              FROM runs_task AS t WHERE t.id = v_child;
            UPDATE runs_agent AS a
            SET open_children = a.open_children - 1,
                active_children = a.active_children - v_dispatched
            WHERE a.id = v_parent
            RETURNING a.open_children, a.mode, a.retry_count, a.run_id
            INTO v_open, v_mode, v_generation, v_run;
        ELSE
            SELECT a.run_id, a.name, a.dependents INTO v_run, v_name, v_dependents
              FROM runs_agent AS a WHERE a.id = v_child;
            UPDATE runs_run AS r
            SET open_children = r.open_children - 1,
                active_children = r.active_children - v_dispatched
            WHERE r.id = v_run
            RETURNING r.open_children, r.mode, r.attempt_number
            INTO v_open, v_mode, v_generation;
        END IF;
        -- Its dependents released, or skipped.
        IF v_dependents <> '[]'::jsonb THEN
            IF v_success OR v_mode = 'sequential' THEN
                PERFORM runs.dependents_release(v_entity, v_parent, v_run, v_generation,
                                                  v_dependents);
            ELSE
                v_open := v_open - runs.dependents_skip(
                    v_entity, v_parent, v_run, v_generation, v_name, v_dependents, p_now);
            END IF;
        END IF;
        -- The parent goes on: its ready children dispatched.
        IF v_open > 0 OR v_entity = 'agent' THEN
            IF v_entity = 'step' THEN
                RETURN QUERY SELECT 'dispatched'::text, d.*
                    FROM runs.steps_dispatch(v_parent, p_now) AS d;
            ELSIF v_entity = 'task' THEN
                RETURN QUERY SELECT 'dispatched'::text, d.*
                    FROM runs.tasks_dispatch(v_parent, p_now) AS d;
            ELSIF v_open > 0 THEN
                RETURN QUERY SELECT 'dispatched'::text, d.*
                    FROM runs.agents_dispatch(v_run, p_now) AS d;
            END IF;
            RETURN QUERY SELECT 'ended'::text, NULL::bigint, NULL::varchar, NULL::bigint,
                NULL::uuid, NULL::smallint,
                (CASE v_entity WHEN 'step' THEN 'task' WHEN 'task' THEN 'agent'
                               ELSE 'run' END)::varchar;
            RETURN;
        END IF;
        -- Or it finished: COMPLETED when one of its children did, else SKIPPED; then
        -- it is the child one level up.
        IF v_entity = 'step' THEN
            SELECT t.status,
                   CASE WHEN EXISTS (
                       SELECT 1 FROM runs_step AS s
                       WHERE s.task_id = t.id AND s.generation = t.retry_count
                         AND s.handler_for_id IS NULL
                         AND (s.status = 'completed' OR s.handled))
                   THEN 'completed' ELSE 'skipped' END
              INTO v_from, v_to
              FROM runs_task AS t WHERE t.id = v_parent;
            v_entity := 'task';
        ELSE
            SELECT a.status,
                   CASE WHEN EXISTS (
                       SELECT 1 FROM runs_task AS tk
                       WHERE tk.agent_id = a.id AND tk.generation = a.retry_count
                         AND tk.status = 'completed')
                   THEN 'completed' ELSE 'skipped' END
              INTO v_from, v_to
              FROM runs_agent AS a WHERE a.id = v_parent;
            v_entity := 'agent';
        END IF;
        PERFORM runs.node_finish(v_entity, v_parent, v_from, v_to, p_now);
        v_child := v_parent;
        v_success := v_to = 'completed';
        v_dispatched := 1;
    END LOOP;
END
$$;
