"""Beat's own schedule, computed tick by tick with a clock the test sets: what an idle
fleet sends, and how soon the sweeps that wait for their work are sent once it is due
(orchestrator/beat.py, orchestrator/periodic.py). Nothing is published: the scheduler
records what it would send, and the test plays the worker where one is needed."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.db import OperationalError
from django_celery_beat.models import PeriodicTask

from config.celery import app
from orchestrator import sweeps
from orchestrator.beat import TrackingDatabaseScheduler
from orchestrator.periodic import BACKSTOP_SECONDS, PERIODIC_PREFIX
from runs.services import run_cancel
from schedules import services as schedule_services
from schedules.models import Schedule
from tests import factories
from tests.schedules.conftest import scheduled_plan
from tests.webhooks.support import endpoint
from webhooks.models import DeliveryStatus, WebhookDelivery

# Transactional: beat reads the periodic tasks as it does in production, closing a
# connection left outside autocommit (which a test's own transaction would be).
pytestmark = pytest.mark.django_db(transaction=True)

WEBHOOK_SWEEP = f"{PERIODIC_PREFIX}webhook-sweep"
SCHEDULE_TICK = f"{PERIODIC_PREFIX}schedule-tick"
LEASE_SWEEP = f"{PERIODIC_PREFIX}lease-sweep"


class Clock:
    """Unix time, from a whole second near the real one (due times in PostgreSQL are
    real moments), moved only by the test."""

    def __init__(self) -> None:
        self.start = self.now = float(int(time.time()))

    def __call__(self) -> float:
        return self.now

    def at(self, seconds: float) -> datetime:
        """The moment ``seconds`` after the test's start, as PostgreSQL stores it."""
        return datetime.fromtimestamp(self.start + seconds, UTC)


class RecordingScheduler(TrackingDatabaseScheduler):
    """Beat as it runs, but what it sends is recorded (name, seconds since the start)."""

    producer = None

    def __init__(self, clock: Clock) -> None:
        self.sent: list[tuple[str, float]] = []
        self.test_clock = clock
        super().__init__(app=app)
        self.clock = clock
        self._last_recorded = math.inf  # no health tick written to the shared Redis

    def apply_async(self, entry: Any, producer: Any = None, advance: bool = True, **_: Any) -> None:
        self.sent.append((entry.name, self.test_clock.now - self.test_clock.start))

    def run_for(self, seconds: float) -> None:
        """Tick after tick, as beat's loop does, the clock moving by each tick's wait."""
        clock = self.test_clock
        end = clock.now + seconds
        while clock.now < end:
            wait = self.tick()
            clock.now = min(end, clock.now + max(wait, 0.001))

    def times(self, name: str) -> list[float]:
        return [at for sent, at in self.sent if sent == name]


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def beat(clock: Clock) -> Iterator[Callable[[], RecordingScheduler]]:
    """Beat on the periodic tasks installed as a deployment does; made when the test
    asks, after any change to the installed tasks (beat reads them as it starts)."""
    call_command("setup_periodic_tasks", stdout=StringIO())
    made: list[RecordingScheduler] = []

    def make() -> RecordingScheduler:
        made.append(RecordingScheduler(clock))
        return made[-1]

    yield make
    for scheduler in made:
        scheduler._finalize.cancel()  # nothing to write back after the test's database


def installed_per_minute() -> float:
    """What beat's ordinary schedule sends of this project's tasks: each installed
    interval once per interval (the backstops of the sweeps that wait for work)."""
    tasks = PeriodicTask.objects.filter(name__startswith=PERIODIC_PREFIX, enabled=True)
    per_minute: float = sum(60 / task.interval.every for task in tasks.select_related("interval"))
    return per_minute


def test_an_idle_fleet_sends_at_most_two_tasks_a_minute(
    beat: Callable[[], RecordingScheduler],
) -> None:
    scheduler = beat()

    scheduler.run_for(600)

    # Nothing waits: no look finds work in ten minutes, so nothing is sent early...
    assert scheduler.sent == []
    # ...and the installed intervals (backstops of 5 min, the retention and wake sweeps'
    # of an hour, expiries of 5 and 10 min) add 1.83 tasks a minute, where every-second
    # and every-15-second sweeps sent 138.
    assert installed_per_minute() == pytest.approx(1.8 + 2 / 60)
    assert installed_per_minute() <= 2


def test_no_periodic_task_is_installed_more_often_than_every_five_minutes() -> None:
    call_command("setup_periodic_tasks", stdout=StringIO())
    intervals = dict(
        PeriodicTask.objects.filter(name__startswith=PERIODIC_PREFIX).values_list(
            "name", "interval__every"
        )
    )

    assert {name for name, every in intervals.items() if every < BACKSTOP_SECONDS} == set()


def test_a_delivery_is_swept_when_due_and_its_retry_when_that_comes(
    beat: Callable[[], RecordingScheduler], clock: Clock
) -> None:
    hook = endpoint(factories.org())
    run_cancel(run_id=factories.run(hook.organization).pk, reason="announce it")
    delivery = WebhookDelivery.objects.get()
    WebhookDelivery.objects.filter(pk=delivery.pk).update(next_attempt_at=clock.at(20.5))
    scheduler = beat()

    scheduler.run_for(22)

    # Sent at its due time exactly (the look before it named the moment), and again at
    # each look while it is pending: the sweep that takes it may be lost.
    assert scheduler.times(WEBHOOK_SWEEP) == pytest.approx([20.5, 21.5])
    # The worker's attempt failed: due again after the backoff.
    WebhookDelivery.objects.filter(pk=delivery.pk).update(next_attempt_at=clock.at(30.25))
    scheduler.sent.clear()

    scheduler.run_for(10)

    assert scheduler.times(WEBHOOK_SWEEP) == pytest.approx([30.25, 31.25])
    WebhookDelivery.objects.filter(pk=delivery.pk).update(status=DeliveryStatus.DELIVERED)
    scheduler.sent.clear()

    scheduler.run_for(120)

    assert scheduler.sent == []


def test_a_claimed_delivery_is_looked_for_again_when_its_lease_ends(
    beat: Callable[[], RecordingScheduler], clock: Clock
) -> None:
    hook = endpoint(factories.org())
    run_cancel(run_id=factories.run(hook.organization).pk, reason="announce it")
    # Claimed at once (the worker died while sending): its lease holds it until 40 s.
    WebhookDelivery.objects.update(next_attempt_at=clock.at(0), lease_until=clock.at(40))
    scheduler = beat()

    scheduler.run_for(41)

    assert scheduler.times(WEBHOOK_SWEEP) == pytest.approx([40])


def test_a_schedule_fires_at_its_due_time(
    beat: Callable[[], RecordingScheduler], clock: Clock
) -> None:
    schedule = schedule_services.schedule_create(
        organization=factories.org(credits=100),
        name="every-minute",
        plan=scheduled_plan(),
        interval="1m",
        now=clock.at(0),
    )
    scheduler = beat()

    scheduler.run_for(60.5)

    assert scheduler.times(SCHEDULE_TICK) == pytest.approx([60])
    # The worker's tick fires it; the next due time is a minute later.
    counts = schedule_services.schedules_fire_due(now=clock.at(60))
    assert counts.get("fired") == 1
    assert Schedule.objects.get(pk=schedule.pk).next_due_at == clock.at(120)
    scheduler.sent.clear()

    scheduler.run_for(60)

    assert scheduler.times(SCHEDULE_TICK) == pytest.approx([120])


def test_a_schedule_created_while_beat_runs_is_found_at_the_next_look(
    beat: Callable[[], RecordingScheduler], clock: Clock
) -> None:
    scheduler = beat()
    scheduler.run_for(10)
    schedule_services.schedule_create(
        organization=factories.org(credits=100),
        name="soon",
        plan=scheduled_plan(),
        interval="1s",
        now=clock.at(10),
    )

    scheduler.run_for(2.5)

    # Found at the look after its creation, sent at its due time, then at each look
    # while no worker fires it.
    assert scheduler.times(SCHEDULE_TICK) == pytest.approx([11, 12])


def test_a_look_that_fails_sends_the_sweep(
    beat: Callable[[], RecordingScheduler], monkeypatch: pytest.MonkeyPatch
) -> None:
    def away() -> datetime:
        raise OperationalError("the database is away")

    monkeypatch.setattr(sweeps, "leases_next_due", away)
    scheduler = beat()

    scheduler.run_for(31)

    assert scheduler.times(LEASE_SWEEP) == pytest.approx([0, 15, 30])


def test_a_sweep_disabled_in_the_admin_is_not_sent(
    beat: Callable[[], RecordingScheduler], clock: Clock
) -> None:
    schedule_services.schedule_create(
        organization=factories.org(credits=100),
        name="every-second",
        plan=scheduled_plan(),
        interval="1s",
        now=clock.at(0),
    )
    call_command("setup_periodic_tasks", stdout=StringIO())
    PeriodicTask.objects.filter(name=SCHEDULE_TICK).update(enabled=False)
    scheduler = beat()

    scheduler.run_for(5)

    assert scheduler.sent == []


def test_a_sweep_sent_early_goes_with_its_installed_options(
    beat: Callable[[], RecordingScheduler], clock: Clock
) -> None:
    hook = endpoint(factories.org())
    run_cancel(run_id=factories.run(hook.organization).pk, reason="announce it")
    WebhookDelivery.objects.update(next_attempt_at=clock.at(0))
    scheduler = beat()
    options: list[dict[str, Any]] = []
    scheduler.apply_async = lambda entry, **kw: options.append(entry.options)  # type: ignore[method-assign]

    scheduler.run_for(0.5)

    assert [(o["queue"], o["priority"], o["expires"]) for o in options] == [("webhooks", 0, 1)]
