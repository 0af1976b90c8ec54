-- runs.dependents_release: a finished child's dependents (`p_names`, its siblings that
-- wait for it) each wait for one dependency less. Its siblings are those of its parent's
-- current children: a task's steps of its generation (on_error handlers left out), an
-- agent's tasks of its generation, a run's agents of its attempt (`p_generation`). The
-- child is a `p_entity` of parent `p_parent` (an agent's: of run `p_run`).
CREATE FUNCTION runs.dependents_release(
    p_entity text, p_parent bigint, p_run uuid, p_generation integer, p_names jsonb
) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF p_entity = 'step' THEN
        UPDATE runs_step SET pending_dependencies = pending_dependencies - 1
        WHERE id = ANY (runs.task_steps_named(p_parent, p_generation::smallint, p_names));
    ELSIF p_entity = 'task' THEN
        UPDATE runs_task SET pending_dependencies = pending_dependencies - 1
        WHERE id = ANY (runs.agent_tasks_named(p_parent, p_generation, p_names));
    ELSE
        UPDATE runs_agent SET pending_dependencies = pending_dependencies - 1
        WHERE run_id = p_run AND attempt_number = p_generation
          AND name IN (SELECT jsonb_array_elements_text(p_names));
    END IF;
END
$$;
