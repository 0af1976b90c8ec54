-- billing.credits_settle: a run attempt's reservation settled on its terminal state.
--
-- The attempt's charges, drawn on the reservation's counter as its steps were recorded
-- (billing.credits_charge), are written to the ledger as one `charge` entry (keyed
-- `charge:<attempt id>`), and whatever is reserved and not charged goes back to the
-- organization as one `refund` entry (keyed `refund:<attempt id>`): so the ledger itself
-- holds `charge + refund = reserve` for every settled attempt. An attempt opened before
-- charges were counted may have entries of its own steps already (keyed
-- `charge:<step>:<step attempt>`): only what they leave unentered is written. The
-- reservation is closed (settled_at), so no charge draws on it afterwards. Returns the
-- amount refunded (0 when nothing remained), or NULL when there was nothing to settle:
-- no reservation, or settled already.
-- The reservation's row is locked first, then the organization's (the lock order).
CREATE FUNCTION billing.credits_settle(
    p_run uuid, p_attempt_number smallint, p_actor text
) RETURNS numeric LANGUAGE plpgsql AS $$
DECLARE
    v_reservation billing_reservation%ROWTYPE;
    v_charge numeric;
    v_refund numeric;
BEGIN
    SELECT * INTO v_reservation FROM billing_reservation
    WHERE run_id = p_run AND attempt_number = p_attempt_number AND settled_at IS NULL
    FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    -- Through the index ledger_attempt_type: none, but for an attempt opened before.
    v_charge := v_reservation.charged - (
        SELECT COALESCE(sum(amount), 0) FROM billing_ledgerentry
        WHERE attempt_id = v_reservation.attempt_id AND type = 'charge');
    IF v_charge > 0 THEN
        PERFORM billing.ledger_entry(
            v_reservation.organization_id, p_run, v_reservation.attempt_id, 'charge',
            v_charge, 'charge:' || v_reservation.attempt_id,
            'charged run ' || p_run || ' attempt ' || p_attempt_number, 'engine',
            clock_timestamp());
    END IF;
    v_refund := v_reservation.reserved - v_reservation.charged - v_reservation.refunded;
    IF v_refund > 0 THEN
        PERFORM billing.ledger_entry(
            v_reservation.organization_id, p_run, v_reservation.attempt_id, 'refund',
            v_refund, 'refund:' || v_reservation.attempt_id,
            'settled run ' || p_run || ' attempt ' || p_attempt_number, p_actor,
            clock_timestamp());
        UPDATE billing_organization SET credits_available = credits_available + v_refund
        WHERE id = v_reservation.organization_id;
    END IF;
    UPDATE billing_reservation
    SET refunded = refunded + GREATEST(v_refund, 0), settled_at = clock_timestamp()
    WHERE id = v_reservation.id;
    RETURN GREATEST(v_refund, 0);
END
$$;
