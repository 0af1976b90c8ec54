"""Install the schedules declared in `orchestrator.schedules` into django-celery-beat."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand
from django.db import transaction
from django_celery_beat.models import IntervalSchedule, PeriodicTask

from orchestrator.schedules import SCHEDULE_PREFIX, schedules


class Command(BaseCommand):
    help = "Create, update or remove periodic tasks to match orchestrator.schedules."

    @transaction.atomic
    def handle(self, *args: Any, **options: Any) -> None:
        wanted = set()
        for schedule in schedules():
            name = f"{SCHEDULE_PREFIX}{schedule.name}"
            wanted.add(name)
            interval, _ = IntervalSchedule.objects.get_or_create(
                every=schedule.every_seconds, period=IntervalSchedule.SECONDS
            )
            PeriodicTask.objects.update_or_create(
                name=name,
                defaults={
                    "task": schedule.task,
                    "interval": interval,
                    "queue": schedule.queue,
                    # Served before any step or run message waiting in the broker: a
                    # sweep that starves behind a backlog cannot rescue it.
                    "priority": 0,
                    "kwargs": json.dumps(schedule.kwargs),
                    "expire_seconds": schedule.expires_seconds or schedule.every_seconds,
                    "enabled": True,
                },
            )
        stale = PeriodicTask.objects.filter(name__startswith=SCHEDULE_PREFIX).exclude(
            name__in=wanted
        )
        removed = stale.count()
        stale.delete()
        self.stdout.write(f"periodic tasks: {len(wanted)} installed, {removed} removed")
