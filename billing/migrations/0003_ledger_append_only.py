"""The ledger is append-only in the database itself: UPDATE and DELETE are refused."""

from django.db import migrations

FORBID = """
CREATE OR REPLACE FUNCTION billing_forbid_ledger_change() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'billing_ledgerentry is append-only: % refused', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END;
$$ LANGUAGE plpgsql;

CREATE TRIGGER billing_ledgerentry_append_only
    BEFORE UPDATE OR DELETE ON billing_ledgerentry
    FOR EACH ROW EXECUTE FUNCTION billing_forbid_ledger_change();
"""

ALLOW = """
DROP TRIGGER IF EXISTS billing_ledgerentry_append_only ON billing_ledgerentry;
DROP FUNCTION IF EXISTS billing_forbid_ledger_change();
"""


class Migration(migrations.Migration):
    dependencies = [("billing", "0002_ledger")]

    operations = [migrations.RunSQL(FORBID, ALLOW)]
