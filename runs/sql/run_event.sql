-- runs.run_event: one event appended to a run's history (runs_runevent: append-only),
-- as runs.transitions writes them: a transition of the run or one of its nodes
-- (`p_entity` 'run', 'agent', 'task' or 'step', from `p_from` to `p_to`), or another kind
-- (a charge, an error) with its message and payload.
CREATE FUNCTION runs.run_event(
    p_run uuid, p_attempt_number smallint, p_entity text, p_entity_id text, p_kind text,
    p_from text, p_to text, p_actor text, p_at timestamptz, p_message text DEFAULT '',
    p_payload jsonb DEFAULT '{}'
) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO runs_runevent
        (run_id, attempt_number, entity, entity_id, kind, from_status, to_status, actor,
         message, payload, created_at)
    VALUES (p_run, p_attempt_number, p_entity, p_entity_id, p_kind, p_from, p_to, p_actor,
            p_message, p_payload, p_at);
END
$$;
