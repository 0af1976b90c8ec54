-- runs.attempt_open: a run's attempt opened with its credits reserved.
--
-- The attempt's row, its reservation (billing.credits_reserve) and the run's event that
-- says so. Returns the attempt's id, or NULL when the organization cannot cover the
-- amount: then nothing is written (the caller refuses with 402 insufficient_credits).
-- `p_reserve` false: the reservation is left to the caller, later in the same
-- transaction (runs.engine.start: a start that takes the organization's locks last);
-- its event is written here all the same, so that the run's history reads in order.
CREATE FUNCTION runs.attempt_open(
    p_run uuid, p_attempt_number smallint, p_amount numeric, p_actor text,
    p_now timestamptz DEFAULT now(), p_reserve boolean DEFAULT true
) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    v_organization uuid;
    v_attempt bigint;
BEGIN
    SELECT organization_id INTO STRICT v_organization FROM runs_run WHERE id = p_run;
    -- The reservation is keyed by the attempt's id: the attempt's row first, undone with
    -- this block when the credits are short.
    BEGIN
        INSERT INTO runs_runattempt (run_id, attempt_number, created_at, finished_at, outcome)
        VALUES (p_run, p_attempt_number, p_now, NULL, '')
        RETURNING id INTO v_attempt;
        IF p_reserve AND billing.credits_reserve(v_organization, p_run, v_attempt, p_attempt_number,
                                  p_amount, p_actor, p_now) IS NULL THEN
            RAISE EXCEPTION USING ERRCODE = 'OEC01';
        END IF;
    EXCEPTION WHEN SQLSTATE 'OEC01' THEN
        RETURN NULL;
    END;
    PERFORM runs.run_event(
        p_run, p_attempt_number, 'run', p_run::text, 'charge', '', '', p_actor, p_now,
        'reserved ' || p_amount || ' credits',
        jsonb_build_object('type', 'reserve', 'amount', p_amount::text));
    RETURN v_attempt;
END
$$;
