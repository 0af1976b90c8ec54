# The attempt's credits now live in billing.Reservation (copied by billing.0007).

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('runs', '0006_run_redispatched_at'),
        ('billing', '0007_reservation'),
    ]

    operations = [
        migrations.RemoveConstraint(
            model_name='runattempt',
            name='attempt_credits_conserved',
        ),
        migrations.RemoveConstraint(
            model_name='runattempt',
            name='attempt_credits_charged_gte_0',
        ),
        migrations.RemoveConstraint(
            model_name='runattempt',
            name='attempt_credits_refunded_gte_0',
        ),
        migrations.RemoveField(
            model_name='runattempt',
            name='credits_charged',
        ),
        migrations.RemoveField(
            model_name='runattempt',
            name='credits_refunded',
        ),
        migrations.RemoveField(
            model_name='runattempt',
            name='credits_reserved',
        ),
        migrations.RemoveField(
            model_name='runattempt',
            name='settled_at',
        ),
    ]
