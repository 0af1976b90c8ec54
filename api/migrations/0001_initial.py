# IdempotencyRecord, moved from the orchestrator app: the existing table is adopted as it
# is (state only), then renamed by 0002.

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        ('billing', '0004_available_only'),
        ('orchestrator', '0002_idempotencyrecord_to_api'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name='IdempotencyRecord',
                    fields=[
                        ('id', models.BigAutoField(primary_key=True, serialize=False)),
                        ('method', models.CharField(max_length=10)),
                        ('path', models.CharField(max_length=500)),
                        ('key', models.CharField(max_length=255)),
                        ('fingerprint', models.CharField(max_length=64)),
                        ('status', models.CharField(choices=[('in_progress', 'In Progress'), ('completed', 'Completed')], default='in_progress', max_length=12)),
                        ('response_status', models.PositiveSmallIntegerField(blank=True, null=True)),
                        ('response_body', models.JSONField(blank=True, null=True)),
                        ('created_at', models.DateTimeField(auto_now_add=True)),
                        ('expires_at', models.DateTimeField()),
                        ('organization', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='idempotency_records', to='billing.organization')),
                    ],
                    options={
                        'db_table': 'orchestrator_idempotencyrecord',
                        'indexes': [models.Index(fields=['expires_at'], name='idempotency_expires')],
                        'constraints': [models.UniqueConstraint(fields=('organization', 'method', 'path', 'key'), name='idempotency_unique_key'), models.CheckConstraint(condition=models.Q(('status__in', ['in_progress', 'completed'])), name='idempotency_status_valid'), models.CheckConstraint(condition=models.Q(('status', 'in_progress'), ('response_status__isnull', False), _connector='OR'), name='idempotency_completed_has_response')],
                    },
                ),
            ],
            database_operations=[],
        ),
    ]
