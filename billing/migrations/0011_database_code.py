"""The ledger's append-only trigger moved to runs/engine/sql/append_only.sql (installed
after migrations, docs/engine.md "Database code"): what billing.0003 once installed in
`public` is removed. A database created since has none of it. Each old trigger goes with
its function (CASCADE): one of the same name that calls the new code is left alone."""

from django.db import migrations

LEGACY = """
DROP FUNCTION IF EXISTS public.billing_forbid_ledger_change() CASCADE;
"""


class Migration(migrations.Migration):
    dependencies = [("billing", "0010_fair_sharing")]

    operations = [migrations.RunSQL(LEGACY, migrations.RunSQL.noop)]
