"""The database's code moved out of migrations into runs/engine/sql, installed into the
schema `engine` after migrations (runs.engine.sql, docs/engine.md "Database code"): what
earlier versions of runs' migrations installed in `public` is removed. A database
created since has none of it. Each old trigger goes with its function (CASCADE), so a
trigger of the same name that calls the new code is left alone."""

from django.db import migrations

LEGACY = """
DROP FUNCTION IF EXISTS public.engine_step_completed;
DROP FUNCTION IF EXISTS public.runs_forbid_event_change() CASCADE;
"""


class Migration(migrations.Migration):
    dependencies = [("runs", "0021_trace_context")]

    operations = [migrations.RunSQL(LEGACY, migrations.RunSQL.noop)]
