# A run attempt's credits move from runs' attempt row to billing's own Reservation row
# (billing writes no table of runs). The rows are copied here, before
# runs.0007 drops the old columns.

import django.db.models.deletion
import django.db.models.expressions
from decimal import Decimal
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('billing', '0006_secret'),
        ('runs', '0006_run_redispatched_at'),
    ]

    operations = [
        migrations.CreateModel(
            name='Reservation',
            fields=[
                ('id', models.BigAutoField(primary_key=True, serialize=False)),
                ('run_id', models.UUIDField()),
                ('attempt_number', models.PositiveSmallIntegerField()),
                ('reserved', models.DecimalField(decimal_places=6, default=Decimal('0'), max_digits=18)),
                ('charged', models.DecimalField(decimal_places=6, default=Decimal('0'), max_digits=18)),
                ('refunded', models.DecimalField(decimal_places=6, default=Decimal('0'), max_digits=18)),
                ('settled_at', models.DateTimeField(blank=True, null=True)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('attempt', models.OneToOneField(on_delete=django.db.models.deletion.PROTECT, related_name='reservation', to='runs.runattempt')),
                ('organization', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='reservations', to='billing.organization')),
            ],
            options={
                'ordering': ['run_id', 'attempt_number'],
                'indexes': [models.Index(fields=['organization', 'settled_at'], name='reservation_org')],
                'constraints': [models.UniqueConstraint(fields=('run_id', 'attempt_number'), name='reservation_unique_attempt'), models.CheckConstraint(condition=models.Q(('reserved__gte', django.db.models.expressions.CombinedExpression(models.F('charged'), '+', models.F('refunded')))), name='reservation_conserved'), models.CheckConstraint(condition=models.Q(('charged__gte', 0)), name='reservation_charged_gte_0'), models.CheckConstraint(condition=models.Q(('refunded__gte', 0)), name='reservation_refunded_gte_0')],
            },
        ),
        migrations.RunSQL(
            sql="""
                INSERT INTO billing_reservation
                    (organization_id, run_id, attempt_number, attempt_id, reserved, charged,
                     refunded, settled_at, created_at)
                SELECT r.organization_id, a.run_id, a.attempt_number, a.id,
                       a.credits_reserved, a.credits_charged, a.credits_refunded,
                       a.settled_at, a.created_at
                FROM runs_runattempt a JOIN runs_run r ON r.id = a.run_id
            """,
            reverse_sql="""
                UPDATE runs_runattempt a
                SET credits_reserved = b.reserved, credits_charged = b.charged,
                    credits_refunded = b.refunded, settled_at = b.settled_at
                FROM billing_reservation b WHERE b.attempt_id = a.id
            """,
        ),
    ]
