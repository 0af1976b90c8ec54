"""Retention (orchestrator/retention.py, docs/tenants.md): webhook deliveries and
attempts, schedule fires older than RETENTION_DAYS are deleted, and only those; a
delivery still to be sent, a fire whose run may still be going, runs, their events and
the ledger are kept."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from django.utils import timezone

from billing.models import LedgerEntry
from orchestrator import retention
from runs import reuse, services
from runs.engine.start import run_start
from runs.models import HistoryEvent, Run, Step, StepCacheEntry
from runs.plan.durations import MAX_DURATION_MS
from schedules.models import FireKind, FireStatus, ScheduleFire, SkipReason
from tests import factories
from tests.schedules.conftest import make_schedule
from tests.webhooks.support import endpoint
from webhooks.models import DeliveryStatus, WebhookAttempt, WebhookDelivery

pytestmark = pytest.mark.django_db

NOW = timezone.now()
WINDOW = timedelta(days=30)
OLD = NOW - WINDOW - timedelta(minutes=1)  # just outside the window
RECENT = NOW - WINDOW + timedelta(minutes=1)  # just inside it
MINUTE = timedelta(minutes=1)


@pytest.fixture(autouse=True)
def thirty_days(settings: Any) -> None:
    settings.RETENTION_DAYS = 30


class Rows:
    """Deliveries, attempts and fires of one organization, each created at a given age."""

    def __init__(self) -> None:
        self.organization = factories.org()
        self.endpoint = endpoint(self.organization)
        self.schedule = make_schedule(self.organization)

    def delivery(self, created_at: datetime, status: str = DeliveryStatus.DELIVERED) -> int:
        row = WebhookDelivery.objects.create(
            endpoint=self.endpoint,
            event_type="run.completed",
            status=status,
            next_attempt_at=created_at,
            created_at=created_at,
        )
        return row.pk

    def attempt(self, delivery: int, created_at: datetime) -> int:
        row = WebhookAttempt.objects.create(
            delivery_id=delivery, number=1, status_code=200, ok=True, duration_ms=5
        )
        WebhookAttempt.objects.filter(pk=row.pk).update(created_at=created_at)
        return row.pk

    def fire(self, created_at: datetime, run: Run | None = None, ended: bool = False) -> int:
        fields: dict[str, Any] = (
            {"status": FireStatus.FIRED, "run": run, "run_ended": ended}
            if run is not None
            else {"status": FireStatus.SKIPPED, "reason": SkipReason.OVERLAP}
        )
        row = ScheduleFire.objects.create(
            schedule=self.schedule,
            kind=FireKind.MANUAL,
            due_at=created_at,
            created_at=created_at,
            **fields,
        )
        return row.pk


def remaining(model: Any, ids: list[int]) -> set[int]:
    return set(model.objects.filter(pk__in=ids).values_list("pk", flat=True))


def test_retention_deletes_only_what_is_older_than_the_window() -> None:
    rows = Rows()
    run = factories.run(rows.organization)
    run_start(run_id=run.pk)
    kept_runs = (Run.objects.count(), HistoryEvent.objects.count(), LedgerEntry.objects.count())
    old_delivered = rows.delivery(OLD)
    old_failed = rows.delivery(OLD, DeliveryStatus.FAILED)
    old_pending = rows.delivery(OLD, DeliveryStatus.PENDING)  # held, still to be sent
    recent = rows.delivery(RECENT)
    old_attempt = rows.attempt(recent, OLD)
    recent_attempt = rows.attempt(recent, RECENT)
    attempt_of_old = rows.attempt(old_delivered, RECENT)  # goes with its delivery
    old_fire = rows.fire(OLD)
    recent_fire = rows.fire(RECENT)
    old_fire_run_going = rows.fire(OLD, run=run)
    old_fire_run_ended = rows.fire(OLD, run=run, ended=True)

    counts = retention.prune(now=NOW)

    assert counts == {
        "webhook_attempts": 2,
        "webhook_deliveries": 2,
        "schedule_fires": 2,
        "step_cache_entries": 0,
    }
    deliveries = [old_delivered, old_failed, old_pending, recent]
    assert remaining(WebhookDelivery, deliveries) == {old_pending, recent}
    attempts = [old_attempt, recent_attempt, attempt_of_old]
    assert remaining(WebhookAttempt, attempts) == {recent_attempt}
    fires = [old_fire, recent_fire, old_fire_run_going, old_fire_run_ended]
    assert remaining(ScheduleFire, fires) == {recent_fire, old_fire_run_going}
    assert (Run.objects.count(), HistoryEvent.objects.count(), LedgerEntry.objects.count()) == (
        kept_runs
    )
    assert retention.prune(now=NOW) == dict.fromkeys(counts, 0)


def test_a_step_cache_entry_is_kept_as_long_as_the_longest_ttl_may_read_it() -> None:
    run = factories.run(factories.org())
    run_start(run_id=run.pk)
    services.run_pick_up(run_id=run.pk)  # a no-op when the start began it at once
    step = Step.objects.filter(run=run).first()
    assert step is not None
    longest = timedelta(milliseconds=MAX_DURATION_MS)

    def entry(key: str, created_at: datetime) -> int:
        return StepCacheEntry.objects.create(
            organization_id=run.organization_id, tool=step.tool, key=key, run=run, step=step,
            created_at=created_at,
        ).pk  # fmt: skip

    unreadable, readable, month_old = (
        entry("k1", NOW - longest - MINUTE),
        entry("k2", NOW - longest + MINUTE),
        entry("k3", OLD),
    )

    assert retention.prune(now=NOW)["step_cache_entries"] == 1
    assert remaining(StepCacheEntry, [unreadable, readable, month_old]) == {readable, month_old}


def test_a_step_cache_entry_written_again_holds_back_no_older_entry() -> None:
    """An entry written again (its step ran again) is the newest by id too: the sweep,
    which walks by id and stops at the first recent row, still reaches the old ones."""
    run = factories.run(factories.org())
    run_start(run_id=run.pk)
    services.run_pick_up(run_id=run.pk)
    step = Step.objects.filter(run=run).first()
    assert step is not None

    def add(key: str) -> None:
        reuse.cache_add(
            organization_id=run.organization_id, run_id=run.pk, step_id=step.pk,
            tool=step.tool, key=key, inputs="",
        )  # fmt: skip

    add("first")
    add("second")
    year_old = NOW - timedelta(milliseconds=MAX_DURATION_MS) - MINUTE
    StepCacheEntry.objects.update(created_at=year_old)
    add("first")  # written again, now

    assert retention.prune(now=NOW, batch=1)["step_cache_entries"] == 1
    assert list(StepCacheEntry.objects.values_list("key", flat=True)) == ["first"]


def test_retention_goes_through_a_backlog_in_batches_and_stops_at_the_recent_rows() -> None:
    rows = Rows()
    old = [rows.delivery(OLD - timedelta(seconds=index)) for index in range(7)]
    held = rows.delivery(OLD, DeliveryStatus.PENDING)
    recent = [rows.delivery(RECENT), rows.delivery(NOW)]

    counts = retention.prune(now=NOW, batch=2)

    assert counts["webhook_deliveries"] == 7
    assert remaining(WebhookDelivery, [*old, held, *recent]) == {held, *recent}


def test_the_sweep_is_due_when_the_first_deletable_row_turns_old() -> None:
    assert retention.next_due() is None
    rows = Rows()
    rows.delivery(OLD, DeliveryStatus.PENDING)  # never deleted: not what the look reads
    assert retention.next_due() is None
    first = rows.delivery(RECENT)
    rows.delivery(NOW)

    due = retention.next_due()

    assert due == RECENT + WINDOW
    assert retention.prune(now=due - timedelta(seconds=1))["webhook_deliveries"] == 0
    assert retention.prune(now=due + timedelta(seconds=1))["webhook_deliveries"] == 1
    assert not WebhookDelivery.objects.filter(pk=first).exists()
