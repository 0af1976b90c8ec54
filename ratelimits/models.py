"""Rate limits shared by the whole fleet (docs/rate-limits.md).

A ``RateLimit`` is an organization's (steps name it in their plan) or, without an
organization, the operators' limit on one tool for every organization's steps of it. A
``RateGrant`` is units granted from one bucket at one moment: the past ones (``used``)
are what the sliding window counts, the future ones are the reservations of steps that
wait for their turn. PostgreSQL holds them all: the window survives a Redis that lost its
data, and a grant commits with the step's state."""

from __future__ import annotations

import uuid

from django.db import models
from django.db.models import Q

from billing.models import Organization
from common.units import duration_text

# A limit's period: from 1 ms to a day (grants older than the longest are pruned).
MAX_PERIOD_MS = 86_400_000
MAX_LIMIT = 1_000_000_000
NAME_MAX_LENGTH = 64
# A rendered key's length (a bucket per key).
KEY_MAX_LENGTH = 200


class RateLimit(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # None: a global limit, on ``tool``, for every organization's steps of that tool.
    organization = models.ForeignKey(
        Organization, null=True, blank=True, on_delete=models.CASCADE, related_name="rate_limits"
    )
    name = models.CharField(max_length=NAME_MAX_LENGTH)
    tool = models.CharField(
        max_length=100, blank=True, help_text="A global limit's tool (no organization)."
    )
    limit = models.PositiveIntegerField(help_text="Units granted at most in any window.")
    period_ms = models.BigIntegerField(help_text="The window's length, in milliseconds.")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(
                fields=["organization", "name"],
                condition=Q(organization__isnull=False),
                name="rate_limit_unique_name",
            ),
            models.UniqueConstraint(
                fields=["tool"],
                condition=Q(organization__isnull=True),
                name="rate_limit_one_per_tool",
            ),
            models.CheckConstraint(
                condition=Q(organization__isnull=True, tool__gt="")
                | Q(organization__isnull=False, tool=""),
                name="rate_limit_owner",
            ),
            models.CheckConstraint(
                condition=Q(limit__gte=1, limit__lte=MAX_LIMIT), name="rate_limit_limit_range"
            ),
            models.CheckConstraint(
                condition=Q(period_ms__gte=1, period_ms__lte=MAX_PERIOD_MS),
                name="rate_limit_period_range",
            ),
        ]

    def __str__(self) -> str:
        owner = f"tool {self.tool}" if self.organization_id is None else self.name
        return f"{owner}: {self.limit} per {duration_text(self.period_ms)}"


class RateGrant(models.Model):
    """Units of one bucket granted at ``granted_at`` (in the future: reserved)."""

    id = models.BigAutoField(primary_key=True)
    # "o:<organization>:<name>:<key>" or "t:<tool>": one sliding window each.
    bucket = models.CharField(max_length=400)
    limit_id = models.UUIDField(db_index=True)  # no foreign key: a limit deleted leaves them
    units = models.PositiveIntegerField()
    granted_at = models.DateTimeField()
    # When the step first asked (its place in the line: requeues keep it) and its run's
    # priority (0 first).
    queued_at = models.DateTimeField()
    priority = models.SmallIntegerField(default=5)
    step_id = models.BigIntegerField(null=True)
    run_id = models.UUIDField(null=True)
    # The run's organization: a tool's bucket is shared, and its line takes turns between
    # organizations (runs.admission.step_admission). None: granted before it was kept.
    organization_id = models.UUIDField(null=True, blank=True)
    # Taken by the step's attempt (counted, never handed again); False: still reserved.
    used = models.BooleanField(default=False)

    class Meta:
        indexes = [
            models.Index(fields=["bucket", "granted_at"], name="rate_grant_window"),
            models.Index(fields=["step_id"], name="rate_grant_reserved", condition=Q(used=False)),
            models.Index(
                fields=["run_id"], name="rate_grant_run_reserved", condition=Q(used=False)
            ),
            models.Index(fields=["granted_at"], name="rate_grant_age"),
        ]

    def __str__(self) -> str:
        return f"{self.units} of {self.bucket} at {self.granted_at:%Y-%m-%d %H:%M:%S.%f}"
