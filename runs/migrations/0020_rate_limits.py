"""Rate limits (docs/rate-limits.md): a run whose plan spends them, a step's rate limits
and why it waits."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0017_waiting_index"),
    ]

    operations = [
        migrations.AddField(
            model_name="run",
            name="rate_limited",
            field=models.BooleanField(db_default=False, default=False),
        ),
        migrations.AddField(
            model_name="step",
            name="rate_limits",
            field=models.JSONField(blank=True, db_default=[], default=list),
        ),
        migrations.AddField(
            model_name="step",
            name="waiting_reason",
            field=models.CharField(blank=True, db_default="", default="", max_length=120),
        ),
        migrations.AddIndex(
            model_name="step",
            index=models.Index(
                condition=models.Q(("waiting_reason", ""), _negated=True),
                fields=["waiting_reason"],
                name="step_rate_waiting",
            ),
        ),
    ]
