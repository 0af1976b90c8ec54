-- runs.agent_tasks_named: the ids of an agent's tasks of one generation named in
-- `p_names` (a JSON array of names: a task's `dependents`), each found by a probe of the
-- unique (agent, generation, name) index.
CREATE FUNCTION runs.agent_tasks_named(p_agent bigint, p_generation integer, p_names jsonb)
RETURNS bigint[] LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (
        SELECT COALESCE(array_agg(tk.id), '{}')
        FROM jsonb_array_elements_text(p_names) AS named (name)
        CROSS JOIN LATERAL (
            SELECT id FROM runs_task
            WHERE agent_id = p_agent AND generation = p_generation AND name = named.name
            OFFSET 0  -- not flattened: one probe per name, whatever the estimates
        ) AS tk
    );
END
$$;
