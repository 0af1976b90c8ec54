"""Install the periodic tasks declared in `orchestrator.periodic` into django-celery-beat."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand
from django.db import transaction
from django_celery_beat.models import IntervalSchedule, PeriodicTask

from orchestrator.periodic import PERIODIC_PREFIX, periodic_tasks


class Command(BaseCommand):
    help = "Create, update or remove periodic tasks to match orchestrator.periodic."

    @transaction.atomic
    def handle(self, *args: Any, **options: Any) -> None:
        wanted = set()
        for periodic in periodic_tasks():
            name = f"{PERIODIC_PREFIX}{periodic.name}"
            wanted.add(name)
            interval, _ = IntervalSchedule.objects.get_or_create(
                every=periodic.every_seconds, period=IntervalSchedule.SECONDS
            )
            PeriodicTask.objects.update_or_create(
                name=name,
                defaults={
                    "task": periodic.task,
                    "interval": interval,
                    "queue": periodic.queue,
                    # Served before any step or run message waiting in the broker: a
                    # sweep that starves behind a backlog cannot rescue it.
                    "priority": 0,
                    "kwargs": json.dumps(periodic.kwargs),
                    "expire_seconds": periodic.expires_seconds,
                    "enabled": True,
                },
            )
        stale = PeriodicTask.objects.filter(name__startswith=PERIODIC_PREFIX).exclude(
            name__in=wanted
        )
        removed = stale.count()
        stale.delete()
        self.stdout.write(f"periodic tasks: {len(wanted)} installed, {removed} removed")
