-- billing.ledger_entry: one entry appended to the credit ledger (billing_ledgerentry:
-- append-only, unique per organization and idempotency key). Its id is returned.
-- `p_at`: when it was written (clock_timestamp(), not the transaction's start: a ledger
-- lists its entries in the order they were written, as the ORM's grants are).
-- The callers keep the balances that go with it (billing.credits_reserve,
-- billing.credits_settle; billing.services for grants). It names no step: a step's charge
-- is on its row, and its attempt's in the attempt's charge entry.
CREATE FUNCTION billing.ledger_entry(
    p_organization uuid, p_run uuid, p_attempt_id bigint, p_type text, p_amount numeric,
    p_key text, p_reason text, p_actor text, p_at timestamptz
) RETURNS uuid LANGUAGE plpgsql AS $$
DECLARE
    v_entry uuid;
BEGIN
    INSERT INTO billing_ledgerentry
        (id, organization_id, run_id, attempt_id, step_id, type, amount, idempotency_key,
         reason, actor, created_at)
    VALUES (gen_random_uuid(), p_organization, p_run, p_attempt_id, NULL, p_type, p_amount,
            p_key, left(p_reason, 500), p_actor, p_at)
    RETURNING id INTO v_entry;
    RETURN v_entry;
END
$$;
