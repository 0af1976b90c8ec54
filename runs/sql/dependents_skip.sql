-- runs.dependents_skip: in a dag, the work that needed a child that did not succeed
-- (named `p_child_name`) is SKIPPED, transitively: its dependents `p_names` still
-- PENDING, then theirs, a wave at a time, each row with its error (dependency_failed)
-- and its event (a wave's by id). Siblings as runs.dependents_release finds them.
-- They are counted off in the parent (open children); returns how many.
CREATE FUNCTION runs.dependents_skip(
    p_entity text, p_parent bigint, p_run uuid, p_generation integer, p_child_name text,
    p_names jsonb, p_now timestamptz
) RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    v_message text := format('skipped: dependency ''%s'' did not complete', p_child_name);
    v_error jsonb;
    v_names text[] := ARRAY(SELECT jsonb_array_elements_text(p_names));
    v_seen text[] := '{}';
    v_wave bigint[];
    v_attempt_number smallint;
    v_skipped integer := 0;
BEGIN
    v_error := jsonb_build_object('code', 'dependency_failed', 'message', v_message);
    LOOP
        v_names := ARRAY(SELECT DISTINCT n FROM unnest(v_names) AS n WHERE n <> ALL (v_seen));
        v_seen := v_seen || v_names;
        IF p_entity = 'step' THEN
            SELECT array_agg(s.id ORDER BY s.id), min(s.attempt_number)
              INTO v_wave, v_attempt_number
              FROM runs_step AS s
             WHERE s.task_id = p_parent AND s.generation = p_generation
               AND s.handler_for_id IS NULL AND s.name = ANY (v_names)
               AND s.status = 'pending';
            EXIT WHEN v_wave IS NULL;
            UPDATE runs_step AS s
            SET status = 'skipped', status_changed_at = p_now, completed_at = p_now,
                duration_ms = runs.duration_ms(p_now, s.started_at, s.created_at),
                error = v_error
            WHERE s.id = ANY (v_wave);
            v_names := ARRAY(SELECT jsonb_array_elements_text(s.dependents)
                             FROM runs_step AS s WHERE s.id = ANY (v_wave));
        ELSIF p_entity = 'task' THEN
            SELECT array_agg(t.id ORDER BY t.id), min(t.attempt_number)
              INTO v_wave, v_attempt_number
              FROM runs_task AS t
             WHERE t.agent_id = p_parent AND t.generation = p_generation
               AND t.name = ANY (v_names) AND t.status = 'pending';
            EXIT WHEN v_wave IS NULL;
            UPDATE runs_task AS t
            SET status = 'skipped', status_changed_at = p_now, completed_at = p_now,
                duration_ms = runs.duration_ms(p_now, t.started_at, t.created_at),
                last_error = v_error
            WHERE t.id = ANY (v_wave);
            v_names := ARRAY(SELECT jsonb_array_elements_text(t.dependents)
                             FROM runs_task AS t WHERE t.id = ANY (v_wave));
        ELSE
            SELECT array_agg(a.id ORDER BY a.id), min(a.attempt_number)
              INTO v_wave, v_attempt_number
              FROM runs_agent AS a
             WHERE a.run_id = p_run AND a.attempt_number = p_generation
               AND a.name = ANY (v_names) AND a.status = 'pending';
            EXIT WHEN v_wave IS NULL;
            UPDATE runs_agent AS a
            SET status = 'skipped', status_changed_at = p_now, completed_at = p_now,
                duration_ms = runs.duration_ms(p_now, a.started_at, a.created_at),
                last_error = v_error
            WHERE a.id = ANY (v_wave);
            v_names := ARRAY(SELECT jsonb_array_elements_text(a.dependents)
                             FROM runs_agent AS a WHERE a.id = ANY (v_wave));
        END IF;
        INSERT INTO runs_runevent
            (run_id, attempt_number, entity, entity_id, kind, from_status, to_status, actor,
             message, payload, created_at)
        SELECT p_run, v_attempt_number, p_entity, w.id::text, 'transition', 'pending',
               'skipped', 'system', v_message, '{}'::jsonb, p_now
        FROM unnest(v_wave) AS w (id)
        ORDER BY w.id;
        v_skipped := v_skipped + cardinality(v_wave);
    END LOOP;
    IF v_skipped > 0 THEN
        IF p_entity = 'step' THEN
            UPDATE runs_task SET open_children = open_children - v_skipped WHERE id = p_parent;
        ELSIF p_entity = 'task' THEN
            UPDATE runs_agent SET open_children = open_children - v_skipped WHERE id = p_parent;
        ELSE
            UPDATE runs_run SET open_children = open_children - v_skipped WHERE id = p_run;
        END IF;
    END IF;
    RETURN v_skipped;
END
$$;
