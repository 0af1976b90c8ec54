"""Traces (docs/observability.md): the W3C traceparent a run keeps (its trace), a step
keeps while it waits (its attempt's span) and a runner job carries. Empty by default in
the database too, so that rows inserted without it (the hot path's statements) need no
change."""

from django.db import migrations, models


def _field() -> models.CharField:  # type: ignore[type-arg]
    return models.CharField(blank=True, db_default="", default="", max_length=128)


class Migration(migrations.Migration):
    dependencies = [("runs", "0020_rate_limits")]

    operations = [
        migrations.AddField(model_name="run", name="trace_context", field=_field()),
        migrations.AddField(model_name="step", name="trace_context", field=_field()),
        migrations.AddField(model_name="runnerjob", name="trace_context", field=_field()),
    ]
