# IdempotencyRecord moves to the api app (the model beside the logic that uses
# it). State only here; the table is kept and renamed by api.0002.

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('orchestrator', '0001_initial'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.DeleteModel(name='IdempotencyRecord')],
            database_operations=[],
        ),
    ]
