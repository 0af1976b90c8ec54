-- runs.free_places: how many more children a parent may have running: its limit
-- (a run's max_agents, an agent's max_concurrent_tasks, a task's max_concurrent_steps)
-- less those it has running (its active_children), never negative. The one rule every
-- dispatch follows (runs.agents_dispatch and the levels below, runs.run_begin, the
-- recordings' shapes). A SQL function of one expression: PostgreSQL inlines it.
CREATE FUNCTION runs.free_places(p_limit integer, p_active integer)
RETURNS integer LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT GREATEST(p_limit - p_active, 0)
$$;
