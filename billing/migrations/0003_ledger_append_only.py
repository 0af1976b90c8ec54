"""The ledger is append-only in the database itself: the trigger is database code,
installed from runs/engine/sql/append_only.sql after migrations (runs.engine.sql)."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("billing", "0002_ledger")]

    operations: list[migrations.operations.base.Operation] = []
