-- runs.run_start: CREATED -> PENDING, with attempt 1 opened and its credits reserved.
--
-- For a run its caller holds locked (runs.services.run_start): the run moved to PENDING
-- as runs.transitions moves it (its event first), then runs.attempt_open (the attempt,
-- the reservation, the reservation's event). `p_admitted_at`: when admission let the run
-- in at once (NULL: it waits for a place). Nothing is written when the run is not
-- CREATED (no row returned), nor when the organization cannot cover the reservation (one
-- row, its attempt_id NULL: the caller refuses with 402 insufficient_credits). Returns the
-- run's new timestamps and the attempt's id, for the caller's copy of the row.
-- `p_reserve` false: the credits are reserved by the caller before it commits
-- (runs.attempt_open).
CREATE FUNCTION runs.run_start(
    p_run uuid, p_amount numeric, p_actor text, p_admitted_at timestamptz,
    p_now timestamptz DEFAULT now(), p_reserve boolean DEFAULT true
) RETURNS TABLE (
    status_changed_at timestamptz, started_at timestamptz, updated_at timestamptz,
    attempt_id bigint
) LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    -- One block: a reservation refused undoes the run's move and its event.
    UPDATE runs_run AS r
    SET status = 'pending', status_changed_at = p_now,
        started_at = COALESCE(r.started_at, p_now), updated_at = p_now, attempt_number = 1,
        admitted_at = p_admitted_at
    WHERE r.id = p_run AND r.status = 'created'
    RETURNING r.status_changed_at, r.started_at, r.updated_at
    INTO status_changed_at, started_at, updated_at;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    PERFORM runs.run_event(p_run, 1::smallint, 'run', p_run::text, 'transition', 'created',
                             'pending', p_actor, p_now);
    attempt_id := runs.attempt_open(p_run, 1::smallint, p_amount, p_actor, p_now, p_reserve);
    IF attempt_id IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'OEC01';
    END IF;
    RETURN NEXT;
EXCEPTION WHEN SQLSTATE 'OEC01' THEN
    status_changed_at := NULL;
    started_at := NULL;
    updated_at := NULL;
    RETURN NEXT;
END
$$;
