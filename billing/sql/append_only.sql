-- The audit tables are append-only in the database itself, not only in their models:
-- UPDATE and DELETE of a ledger entry (billing_ledgerentry) are refused, whatever the
-- code or client. billing.refuse_change guards the run events too (runs/sql/append_only.sql).
CREATE FUNCTION billing.refuse_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '% is append-only: % refused', TG_TABLE_NAME, TG_OP
        USING ERRCODE = 'insufficient_privilege';
END
$$;

CREATE OR REPLACE TRIGGER billing_ledgerentry_append_only
BEFORE UPDATE OR DELETE ON billing_ledgerentry
FOR EACH ROW EXECUTE FUNCTION billing.refuse_change();
