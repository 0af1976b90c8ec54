-- runs.steps_insert: new steps, written from their rows.
--
-- `p_steps`: a JSON array of the steps' values (runs.materialize.step_values), each naming
-- its task by index in `p_tasks` ("task", from 0), in task then position order, which
-- their ids follow. A new step starts PENDING, never attempted, on no worker, costing
-- nothing. runs.attempt_materialize writes an attempt's first steps with it, and a wide
-- plan's others come in batches, so that no statement carries a whole 20,000-step plan.
-- Returns how many were written. PL/pgSQL, not SQL: PostgreSQL 15 plans a SQL function's
-- INSERT again on every call, where PL/pgSQL keeps its plan for the session (it runs on
-- every start).
CREATE FUNCTION runs.steps_insert(
    p_run uuid, p_number smallint, p_tasks bigint[], p_steps jsonb, p_now timestamptz
) RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    written integer;
BEGIN
    INSERT INTO runs_step
        (created_at, status_changed_at, run_id, task_id, attempt_number, name, position,
         generation, tool, params, "when", on_error, on_callback, retry, timeout_ms,
         rate_limits, depends_on, pending_dependencies, dependents, reused_from, cache,
         status, attempts, failures, reclaims, worker, cost, celery_task_id, handled)
    SELECT p_now, p_now, p_run, p_tasks[s.task + 1], p_number, s.name, s.position,
           s.generation, s.tool, s.params, s."when", s.on_error, s.on_callback, s.retry,
           s.timeout_ms, s.rate_limits, s.depends_on, s.pending_dependencies,
           s.dependents, s.reused_from, s.cache, 'pending', 0, 0, 0, '', 0, '', false
    FROM jsonb_to_recordset(p_steps) AS s(
        task integer, name text, position integer, generation smallint, tool text,
        params jsonb, "when" text, on_error jsonb, on_callback jsonb, retry jsonb,
        timeout_ms bigint, rate_limits jsonb, depends_on jsonb,
        pending_dependencies integer, dependents jsonb, reused_from jsonb, cache jsonb)
    ORDER BY s.task, s.position;
    GET DIAGNOSTICS written = ROW_COUNT;
    RETURN written;
END
$$;
