-- runs.task_steps_named: the ids of a task's steps of one generation named in `p_names`
-- (a JSON array of names: a step's `dependents`), on_error handlers left out.
--
-- Each found by a probe of the unique (task, generation, name) index: a condition on the
-- names alone let PostgreSQL, with a table not yet analysed, walk every step of the
-- table through the handler index.
CREATE FUNCTION runs.task_steps_named(p_task bigint, p_generation smallint, p_names jsonb)
RETURNS bigint[] LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (
        SELECT COALESCE(array_agg(st.id), '{}')
        FROM jsonb_array_elements_text(p_names) AS named (name)
        CROSS JOIN LATERAL (
            SELECT id FROM runs_step
            WHERE task_id = p_task AND generation = p_generation AND name = named.name
              AND handler_for_id IS NULL
            OFFSET 0  -- not flattened: one probe per name, whatever the estimates
        ) AS st
    );
END
$$;
