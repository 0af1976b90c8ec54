# The run's plan is `plan` everywhere now (the API always said so): the column is renamed,
# its data untouched.
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0007_attempt_credits_to_billing"),
    ]

    operations = [
        migrations.RenameField(model_name="run", old_name="spec", new_name="plan"),
        migrations.AlterField(
            model_name="run",
            name="plan",
            field=models.JSONField(help_text="The plan exactly as submitted."),
        ),
    ]
