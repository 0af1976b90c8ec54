# The adopted table takes the api app's name.

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('api', '0001_initial'),
    ]

    operations = [
        migrations.AlterModelTable(name='idempotencyrecord', table=None),
    ]
