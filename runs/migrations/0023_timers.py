"""A step's time parked (rate limits, timers) apart from its attempt's: ``waited_ms``."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("runs", "0022_database_code")]

    operations = [
        migrations.AddField(
            model_name="step",
            name="waited_ms",
            field=models.BigIntegerField(db_default=0, default=0),
        ),
    ]
