-- runs.step_limit: how many steps an organization may run at once, as it stands now: its
-- own max_running_steps, or `p_default` (the setting ORG_MAX_RUNNING_STEPS) where it set
-- none (0), as runs.admission.run_admission.limits_of reads it. The statements that take a step slot
-- (runs/queries/step_slot_*.sql) read it themselves: a changed limit applies at the next
-- slot taken, without a query of its own.
CREATE FUNCTION runs.step_limit(p_organization uuid, p_default integer)
RETURNS integer LANGUAGE sql STABLE AS $$
    SELECT COALESCE(NULLIF(o.max_running_steps, 0), p_default)
    FROM billing_organization AS o WHERE o.id = p_organization
$$;
