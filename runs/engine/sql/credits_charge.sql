-- engine.credits_charge: one step attempt's cost, drawn on its run attempt's reservation.
--
-- Keyed by step and step attempt (`charge:<step>:<attempt>`): one charge per attempt,
-- ever; a replay draws nothing more. Only while the reservation is unsettled and holds
-- enough: otherwise nothing is written. Returns the ledger entry's id, or NULL when
-- nothing was charged (beyond the reservation, settled, or charged already: the caller
-- tells which). Two concurrent replays serialise on the reservation's row and the second
-- then fails on the ledger's unique key, rolling its transaction back. The amount must
-- be positive and already rounded (billing.services.to_credits).
CREATE FUNCTION engine.credits_charge(
    p_organization uuid, p_run uuid, p_attempt_number smallint, p_step bigint,
    p_step_attempt integer, p_amount numeric, p_reason text, p_actor text
) RETURNS uuid LANGUAGE plpgsql AS $$
DECLARE
    v_key text := 'charge:' || p_step || ':' || p_step_attempt;
    v_attempt_id bigint;
BEGIN
    UPDATE billing_reservation AS r SET charged = r.charged + p_amount
    WHERE r.run_id = p_run AND r.attempt_number = p_attempt_number
      AND r.settled_at IS NULL
      AND r.reserved - r.charged - r.refunded >= p_amount
      AND NOT EXISTS (
          SELECT 1 FROM billing_ledgerentry AS l
          WHERE l.organization_id = p_organization AND l.idempotency_key = v_key
      )
    RETURNING r.attempt_id INTO v_attempt_id;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    RETURN engine.ledger_entry(p_organization, p_run, v_attempt_id, p_step, 'charge', p_amount,
                               v_key, p_reason, p_actor, clock_timestamp());
END
$$;
