-- billing.credits_charge: one step attempt's cost, drawn on its run attempt's reservation.
--
-- A counter, not a ledger entry: the reservation's `charged` grows, checked against what
-- it still holds, and the attempt's charges reach the ledger as one entry when it
-- settles (billing.credits_settle). Only while the reservation is unsettled and holds
-- enough: otherwise nothing is drawn. Returns whether it was drawn.
--
-- Exactly once per step attempt is the caller's to keep, and every caller keeps it the
-- same way: it charges in the transaction that moves the step attempt out of RUNNING,
-- holding the step's row locked and found by its status and attempt number (a
-- recording, a wait that parks), so a duplicate finds the attempt recorded and charges
-- nothing. Concurrent charges of one run attempt serialise on the reservation's row.
-- The amount must be positive and already rounded (billing.services.to_credits).
CREATE FUNCTION billing.credits_charge(
    p_run uuid, p_attempt_number smallint, p_amount numeric
) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    UPDATE billing_reservation AS r SET charged = r.charged + p_amount
    WHERE r.run_id = p_run AND r.attempt_number = p_attempt_number
      AND r.settled_at IS NULL
      AND r.reserved - r.charged - r.refunded >= p_amount;
    RETURN FOUND;
END
$$;
