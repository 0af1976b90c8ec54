"""The webhook deliveries' triggers moved to runs/engine/sql/webhook_deliveries.sql
(installed after migrations, docs/engine.md "Database code"): what webhooks.0001 once
installed in `public` is removed. A database created since has none of it. Each old
trigger goes with its function (CASCADE): one of the same name that calls the new code
is left alone."""

from django.db import migrations

LEGACY = """
DROP FUNCTION IF EXISTS public.webhooks_escalation_event() CASCADE;
DROP FUNCTION IF EXISTS public.webhooks_run_event() CASCADE;
DROP FUNCTION IF EXISTS public.webhooks_tell_disabled(runs_run, text);
"""


class Migration(migrations.Migration):
    dependencies = [("webhooks", "0001_initial")]

    operations = [migrations.RunSQL(LEGACY, migrations.RunSQL.noop)]
