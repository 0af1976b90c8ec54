"""Run schedules (docs/schedules.md): a plan run by cron or every interval, and a record
of every time it was due.

``Schedule`` holds what to run (the plan as submitted, and variables laid over the
plan's own) and when (a cron in a time zone, or an interval, from an anchor, with an
optional end), its policies for overlapping runs and missed times, and where it stands:
``next_due_at``, the oldest due time not handled yet (the tick's index), and
``last_due_at``, the latest one handled; ``paused_reason`` says why a paused one is
(``insufficient_credits``: it paused itself, its runs refused for credits again and again).

``ScheduleFire`` is one due time handled, or one manual trigger: ``fired`` with the run it
started, or ``skipped`` with the reason. A due time is handled once, whatever the number
of ticks or beats: PostgreSQL refuses a second row for the same (schedule, due time).
It is also where a run's schedule is known from: ``run`` points at the run, and nothing
in the runs app knows schedules exist.
"""

from __future__ import annotations

import uuid
from datetime import datetime

from django.db import models
from django.db.models import Q
from django.utils.timezone import now

from billing.models import Organization
from runs.models import Run

NAME_MAX_LENGTH = 200
# Schedules with a due time to come: what the tick fires, by ``next_due_at``.
ACTIVE = Q(paused_at__isnull=True, next_due_at__isnull=False)
CRON_MAX_LENGTH = 200
TIMEZONE_MAX_LENGTH = 64
MIN_INTERVAL_MS = 1000


class Overlap(models.TextChoices):
    """What a due time does while the schedule's previous run has not ended."""

    SKIP = "skip"
    ALLOW = "allow"
    CANCEL_PREVIOUS = "cancel_previous"


class Catchup(models.TextChoices):
    """What a tick fires of the due times that passed while no tick ran (beat down)."""

    NONE = "none"
    LATEST = "latest"
    ALL = "all"


class ScheduleStatus(models.TextChoices):
    ACTIVE = "active"
    PAUSED = "paused"
    ENDED = "ended"  # no due time is left (past end_at)


class FireKind(models.TextChoices):
    SCHEDULED = "scheduled"  # a due time
    MANUAL = "manual"  # POST /schedules/{id}/trigger


class FireStatus(models.TextChoices):
    FIRED = "fired"
    SKIPPED = "skipped"


class SkipReason(models.TextChoices):
    OVERLAP = "overlap"
    MISSED = "missed"
    INSUFFICIENT_CREDITS = "insufficient_credits"
    TOO_MANY_PENDING_RUNS = "too_many_pending_runs"
    INVALID_PLAN = "invalid_plan"
    SUSPENDED = "suspended"  # its organization is suspended (docs/tenants.md)


class PausedReason(models.TextChoices):
    """Why a schedule is paused: a person paused it, or it paused itself after its runs
    were refused for credits SCHEDULES_PAUSE_AFTER_CREDIT_REFUSALS times in a row."""

    MANUAL = "manual"
    INSUFFICIENT_CREDITS = "insufficient_credits"


class Schedule(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    organization = models.ForeignKey(
        Organization, on_delete=models.CASCADE, related_name="schedules"
    )
    name = models.CharField(max_length=NAME_MAX_LENGTH)
    # As submitted; each run's plan is this with `variables` laid over its own.
    plan = models.JSONField()
    variables = models.JSONField(default=dict, blank=True)
    cron = models.CharField(max_length=CRON_MAX_LENGTH, blank=True)
    interval_ms = models.BigIntegerField(null=True, blank=True)
    timezone = models.CharField(max_length=TIMEZONE_MAX_LENGTH, default="UTC")
    start_at = models.DateTimeField(null=True, blank=True)
    end_at = models.DateTimeField(null=True, blank=True)
    overlap = models.CharField(max_length=20, choices=Overlap.choices, default=Overlap.SKIP)
    catchup = models.CharField(max_length=10, choices=Catchup.choices, default=Catchup.NONE)
    paused_at = models.DateTimeField(null=True, blank=True)
    paused_reason = models.CharField(max_length=30, choices=PausedReason.choices, blank=True)
    # Due times refused for credits in a row; a run started sets it back to 0.
    credit_refusals = models.PositiveIntegerField(default=0)
    # The oldest due time not handled yet; null once none is left.
    next_due_at = models.DateTimeField(null=True, blank=True)
    # The latest due time handled (fired or skipped); manual triggers are not due times.
    last_due_at = models.DateTimeField(null=True, blank=True)
    created_by = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(default=now, editable=False)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ("-created_at", "-id")
        constraints = [
            models.CheckConstraint(
                condition=(Q(cron="") & Q(interval_ms__gte=MIN_INTERVAL_MS))
                | (~Q(cron="") & Q(interval_ms__isnull=True)),
                name="schedules_schedule_one_cadence",
            ),
            models.CheckConstraint(
                condition=Q(start_at__isnull=True)
                | Q(end_at__isnull=True)
                | Q(end_at__gt=models.F("start_at")),
                name="schedules_schedule_ends_after_start",
            ),
        ]
        indexes = [
            # The tick's query, and beat's look for the next: active schedules by their
            # next due time.
            models.Index(fields=["next_due_at"], condition=ACTIVE, name="schedules_due"),
            models.Index(fields=["organization", "-created_at"], name="schedules_by_org"),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def status(self) -> str:
        if self.paused_at is not None:
            return ScheduleStatus.PAUSED
        if self.next_due_at is None:
            return ScheduleStatus.ENDED
        return ScheduleStatus.ACTIVE

    @property
    def anchor(self) -> datetime:
        """Where its due times count from: ``start_at``, or ``created_at``."""
        return self.start_at or self.created_at


class ScheduleFire(models.Model):
    schedule = models.ForeignKey(
        Schedule, on_delete=models.CASCADE, related_name="fires", db_index=False
    )
    kind = models.CharField(max_length=10, choices=FireKind.choices)
    # The due time; a manual trigger's is when it was asked for.
    due_at = models.DateTimeField()
    status = models.CharField(max_length=10, choices=FireStatus.choices)
    reason = models.CharField(max_length=30, choices=SkipReason.choices, blank=True)
    message = models.TextField(blank=True)
    run = models.ForeignKey(Run, on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    # Set once the run is seen ended (by the next overlap check): that check reads only
    # the runs not known to have ended, however long the schedule's history.
    run_ended = models.BooleanField(default=False)
    created_at = models.DateTimeField(default=now, editable=False)

    class Meta:
        ordering = ("-id",)
        constraints = [
            # Exactly one fire per due time, whatever the number of beats or ticks.
            models.UniqueConstraint(
                fields=["schedule", "due_at"],
                condition=Q(kind=FireKind.SCHEDULED),
                name="schedules_one_fire_per_due_time",
            ),
            models.CheckConstraint(
                condition=(Q(status=FireStatus.FIRED) & Q(reason=""))
                | (Q(status=FireStatus.SKIPPED) & ~Q(reason="") & Q(run__isnull=True)),
                name="schedules_fire_outcome",
            ),
        ]
        indexes = [
            # A schedule's history newest first, its last run, its runs (?schedule=).
            models.Index(fields=["schedule", "-id"], name="schedules_fires_by_schedule"),
            # The runs an overlap check reads.
            models.Index(
                fields=["schedule"],
                condition=Q(run__isnull=False, run_ended=False),
                name="schedules_fires_running",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.schedule_id} {self.kind} {self.due_at:%Y-%m-%d %H:%M:%S} {self.status}"
