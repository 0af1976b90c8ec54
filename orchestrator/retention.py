"""Retention (docs/tenants.md, "Retention"): the records that grow with every event and
every due time are deleted once older than RETENTION_DAYS, by a beat sweep.

Deleted: webhook attempts; webhook deliveries no longer pending (delivered or given up);
schedule fires, but the ones whose run is not yet known to have ended (a schedule's
overlap check reads them); and step cache entries older than the longest `ttl` a plan
may declare (a year: no step can read them any more). Kept, whatever their age: runs,
their events, the ledger and reservations (the account and the audit trail), and a
delivery still to be sent (held by a suspension, or redelivered by hand).

The age is each row's ``created_at``. None of these tables has an index on it, and none
is needed: ids grow with time, so the oldest rows are the first by primary key. The sweep
walks each table by id in windows of ``batch`` rows and deletes the old ones of each
window, one short transaction per window, until a window holds a recent row (those after
it are recent too), nothing is left, or its time budget is spent: a pass reads and
deletes at most ``batch`` rows at a time, and reads nothing past the first recent
window. ``next_due`` tells beat when the first row by id turns old, so an idle sweep
costs a one-row read per table per look.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone

from runs.models import StepCacheEntry
from runs.plan.durations import MAX_DURATION_MS
from schedules.models import ScheduleFire
from webhooks.models import DeliveryStatus, WebhookAttempt, WebhookDelivery

# Rows one window reads and deletes at most, and the seconds one sweep goes on for.
BATCH = 1000
BUDGET_S = 30.0


@dataclass(frozen=True)
class Retained:
    """One table under retention: its rows older than the window are deleted, but the
    ones ``keep`` matches."""

    name: str
    model: type[models.Model]
    keep: Q | None = None
    # How long its rows are kept, when not RETENTION_DAYS.
    kept_for: timedelta | None = None

    def deletable(self) -> models.QuerySet[models.Model]:
        rows = self.model._default_manager.all()
        return rows if self.keep is None else rows.exclude(self.keep)

    def window(self) -> timedelta:
        return self.kept_for or timedelta(days=settings.RETENTION_DAYS)


# Attempts first: a delivery's attempts then mostly go before it does.
RETAINED = (
    Retained("webhook_attempts", WebhookAttempt),
    Retained("webhook_deliveries", WebhookDelivery, keep=Q(status=DeliveryStatus.PENDING)),
    Retained("schedule_fires", ScheduleFire, keep=Q(run__isnull=False, run_ended=False)),
    # A step cache's entry answers steps whose `ttl` it is younger than: past the longest
    # ttl a plan may declare, no step can read it any more.
    Retained(
        "step_cache_entries", StepCacheEntry, kept_for=timedelta(milliseconds=MAX_DURATION_MS)
    ),
)
_NAMES = {retained.model._meta.label: retained.name for retained in RETAINED}


def cutoff(retained: Retained, now: datetime | None = None) -> datetime:
    """Its rows created before this moment are old."""
    return (now or timezone.now()) - retained.window()


def prune(
    *, now: datetime | None = None, batch: int = BATCH, budget_s: float = BUDGET_S
) -> dict[str, int]:
    """Delete what is older than the retention window, each table for its share of the
    time budget (a backlog of one does not hold back the others); return how many rows of
    each table (a delivery's attempts deleted with it count as attempts). Safe to run
    twice at once: each deletes what it finds still there."""
    counts = {retained.name: 0 for retained in RETAINED}
    for retained in RETAINED:
        deadline = time.monotonic() + budget_s / len(RETAINED)
        before = cutoff(retained, now)
        for label, count in _prune_table(retained, before, batch, deadline).items():
            counts[_NAMES.get(label, label)] += count
    return counts


def _prune_table(
    retained: Retained, before: datetime, batch: int, deadline: float
) -> dict[str, int]:
    """Walk one table by id, a window at a time, deleting its old rows (module doc)."""
    deleted: dict[str, int] = {}
    after = 0
    while True:
        window = list(
            retained.model._default_manager.filter(pk__gt=after)
            .order_by("pk")
            .values_list("pk", "created_at")[:batch]
        )
        old = [pk for pk, created_at in window if created_at < before]
        if old:
            rows = retained.deletable().filter(pk__in=old, created_at__lt=before)
            for label, count in rows.delete()[1].items():
                deleted[label] = deleted.get(label, 0) + count
        # A recent row (or the end of the table): every row after it is recent too.
        if len(old) < batch or time.monotonic() >= deadline:
            return deleted
        after = window[-1][0]


def next_due() -> datetime | None:
    """When the first deletable row by id turns old: when beat sends the sweep. Ids and
    creation times can disagree by the length of a transaction, seconds against days; the
    sweep's backstop covers it."""
    due = [
        created_at + retained.window()
        for retained in RETAINED
        if (
            created_at := retained.deletable()
            .order_by("pk")
            .values_list("created_at", flat=True)
            .first()
        )
        is not None
    ]
    return min(due) if due else None
