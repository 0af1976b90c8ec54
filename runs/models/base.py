"""What the run app's models share: when a row started, finished and last changed
state, and the check constraints on counters and statuses."""

from __future__ import annotations

from django.db import models
from django.db.models import Q


def non_negative(model: str, *fields: str) -> models.CheckConstraint:
    """One constraint for all of a row's counters: PostgreSQL prepares each CHECK of a
    table again for every statement that writes it (about 7 us each; a step's row is
    written four times), so one condition costs less than one per column."""
    return models.CheckConstraint(
        condition=Q(**{f"{field}__gte": 0 for field in fields}), name=f"{model}_counts_gte_0"
    )


def status_in(model: str, choices: type[models.TextChoices]) -> models.CheckConstraint:
    return models.CheckConstraint(
        condition=Q(status__in=choices.values), name=f"{model}_status_valid"
    )


class Timestamps(models.Model):
    """When an entity started, finished, and last changed state."""

    created_at = models.DateTimeField(auto_now_add=True)
    status_changed_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    completed_at = models.DateTimeField(null=True, blank=True)
    duration_ms = models.BigIntegerField(null=True, blank=True)

    class Meta:
        abstract = True
