"""Schedules fired by real processes: two `celery beat` processes at once (by mistake)
publishing the schedule tick at each due time of a schedule due every second, and the
session's real worker running it (tests/conftest.py). Each due time is handled once and
starts one run."""

from __future__ import annotations

from collections.abc import Iterator
from io import StringIO

import pytest
import redis
from django.core.management import call_command
from django_celery_beat.models import PeriodicTask

from runs.models import Run
from schedules import services
from schedules.models import Schedule, ScheduleFire
from tests import factories
from tests.schedules.conftest import scheduled_plan
from tests.support import Child, child_env, python_cmd, wait_until

pytestmark = pytest.mark.integration

TICK = "Sending due task orchestrator:schedule-tick"


@pytest.fixture
def two_beats(
    transactional_db: None,
    celery_worker: str,
    broker: redis.Redis[bytes],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[list[Child]]:
    """The periodic tasks installed as a deployment does, then two beats on them."""
    call_command("setup_periodic_tasks", stdout=StringIO())
    logs = tmp_path_factory.mktemp("beats")
    beats = [
        Child(
            python_cmd("-m", "celery", "-A", "config", "beat", "--pidfile=", "--loglevel", "INFO"),
            child_env(LOG_LEVEL="INFO"),
            logs / f"beat-{number}.log",
        )
        for number in (1, 2)
    ]
    try:
        yield beats
    finally:
        for beat in beats:
            beat.stop(timeout=10)
            beat.kill_group()


@pytest.mark.django_db
def test_the_tick_is_installed_as_a_backstop_that_expires_after_one_look() -> None:
    call_command("setup_periodic_tasks", stdout=StringIO())

    tick = PeriodicTask.objects.get(name="orchestrator:schedule-tick")

    # Beat sends it when a schedule is due, looking every second (tests/orchestrator/
    # test_beat.py); installed, it runs every five minutes whatever is due.
    assert (tick.task, tick.interval.every, tick.interval.period) == (
        "orchestrator.sweeps.schedules",
        300,
        "seconds",
    )
    assert (tick.queue, tick.priority, tick.expire_seconds) == ("sweeps", 0, 1)


@pytest.mark.django_db(transaction=True)
def test_two_beats_at_once_fire_each_due_time_once(two_beats: list[Child]) -> None:
    organization = factories.org(credits=100)
    schedule = services.schedule_create(
        organization=organization,
        name="every-second",
        plan=scheduled_plan(),
        interval="1s",
        overlap="allow",  # every due time starts a run: nothing hides a double fire
    )

    def both_ticking_and_fired() -> bool:
        for beat in two_beats:
            if not beat.alive():
                raise AssertionError(f"beat exited early:\n{beat.output()}")
        ticks = [beat.output().count(TICK) for beat in two_beats]
        return min(ticks) >= 3 and ScheduleFire.objects.filter(status="fired").count() >= 5

    wait_until(both_ticking_and_fired, timeout=60, what="both beats ticking and 5 fires")
    # Paused under the row's lock: a tick still under way finishes first, later ones
    # find nothing to fire, and what is counted below stays as it is.
    services.schedule_pause(schedule_id=schedule.pk)

    fires = list(ScheduleFire.objects.filter(schedule=schedule).order_by("due_at"))
    due_times = [fire.due_at for fire in fires]
    assert len(due_times) == len(set(due_times))
    # Every due time on the schedule's own grid: whole seconds after its creation.
    assert all((due - schedule.created_at).total_seconds() in range(1, 120) for due in due_times)
    fired = [fire for fire in fires if fire.status == "fired"]
    runs = Run.objects.filter(created_by=f"schedule:{schedule.pk}")
    # One run per fired due time, no other: a tick that lost the race left nothing.
    assert sorted(str(run.pk) for run in runs) == sorted(str(fire.run_id) for fire in fired)
    assert {fire.reason for fire in fires if fire.status == "skipped"} <= {"missed"}
    assert Schedule.objects.get().last_due_at == due_times[-1]
