-- runs.run_gate: a run's gate, for the rest of the transaction.
--
-- The lock that keeps the recordings of a run's steps (runs.step_completed) apart from
-- everything else that changes the run (docs/engine.md, "Locks"). Recordings take it
-- shared (`p_shared`), and so overlap; every other change of the run takes it
-- exclusively first (runs.transitions.lock_gate, runs.services.lock_run), waits for the
-- recordings under way and holds new ones off until it commits. A transaction-scoped
-- advisory lock, not the run's row lock in share mode: PostgreSQL queues advisory lock
-- requests in order, so a cancel waits for the recordings already in, never for a stream
-- of new ones. (Two runs' hashes may meet: they then share a gate, which costs waiting,
-- never correctness.) Returns true, for use in a query's condition.
CREATE FUNCTION runs.run_gate(p_run uuid, p_shared boolean DEFAULT false)
RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    -- 0x67617465, "gate": admission's organization lock has a namespace of its own.
    IF p_shared THEN
        PERFORM pg_advisory_xact_lock_shared(1734440037, hashtext(p_run::text));
    ELSE
        PERFORM pg_advisory_xact_lock(1734440037, hashtext(p_run::text));
    END IF;
    RETURN true;
END
$$;
