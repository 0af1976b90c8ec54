-- billing.credits_reserve: hold credits of an organization for a run attempt.
--
-- The organization's row is its account: it is locked first (FOR NO KEY UPDATE), so two
-- reservations never both see the same available balance, whatever the connection (the
-- lock order everywhere: run -> agent -> task -> step -> attempt -> organization).
-- Keyed by the attempt (`reserve:<attempt id>`): a replay returns the first entry. Writes
-- the ledger's reserve entry and the attempt's reservation row (billing_reservation).
-- Returns the entry's id, or NULL when the organization has too little available
-- (nothing written). The amount must be positive and already rounded
-- (billing.services.to_credits).
CREATE FUNCTION billing.credits_reserve(
    p_organization uuid, p_run uuid, p_attempt_id bigint, p_attempt_number smallint,
    p_amount numeric, p_actor text, p_now timestamptz DEFAULT now()
) RETURNS uuid LANGUAGE plpgsql AS $$
DECLARE
    v_key text := 'reserve:' || p_attempt_id;
    v_entry uuid;
BEGIN
    PERFORM 1 FROM billing_organization WHERE id = p_organization FOR NO KEY UPDATE;
    SELECT id INTO v_entry FROM billing_ledgerentry
    WHERE organization_id = p_organization AND idempotency_key = v_key;
    IF FOUND THEN
        RETURN v_entry;
    END IF;
    UPDATE billing_organization SET credits_available = credits_available - p_amount
    WHERE id = p_organization AND credits_available >= p_amount;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    v_entry := billing.ledger_entry(p_organization, p_run, p_attempt_id, 'reserve',
                                   p_amount, v_key, 'run ' || p_run || ' attempt '
                                   || p_attempt_number, p_actor, p_now);
    INSERT INTO billing_reservation
        (organization_id, run_id, attempt_number, attempt_id, reserved, charged, refunded,
         settled_at, created_at)
    VALUES (p_organization, p_run, p_attempt_number, p_attempt_id, p_amount, 0, 0, NULL, p_now);
    RETURN v_entry;
END
$$;
