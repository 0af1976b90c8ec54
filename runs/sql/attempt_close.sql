-- runs.attempt_close: a run's attempt closed on the run's terminal state.
--
-- Its outcome and end recorded, its reservation settled (billing.credits_settle) and the
-- refund, when there was one, told in the run's events. Returns the amount refunded, or
-- NULL when the attempt had nothing to settle.
CREATE FUNCTION runs.attempt_close(
    p_run uuid, p_attempt_number smallint, p_outcome text, p_finished_at timestamptz,
    p_actor text, p_now timestamptz DEFAULT now()
) RETURNS numeric LANGUAGE plpgsql AS $$
DECLARE
    v_refund numeric;
BEGIN
    UPDATE runs_runattempt SET outcome = p_outcome, finished_at = p_finished_at
    WHERE run_id = p_run AND attempt_number = p_attempt_number;
    v_refund := billing.credits_settle(p_run, p_attempt_number, p_actor);
    IF v_refund > 0 THEN
        PERFORM runs.run_event(
            p_run, p_attempt_number, 'run', p_run::text, 'charge', '', '', p_actor, p_now,
            'refunded ' || v_refund || ' credits',
            jsonb_build_object('type', 'refund', 'amount', v_refund::text));
    END IF;
    RETURN v_refund;
END
$$;
