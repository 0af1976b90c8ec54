"""The schedule services with a clock the test sets: what is stored, what is refused and
why, and what each tick fires, skips or misses."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import IntegrityError, transaction

from billing.models import Organization
from billing.services import InsufficientCredits, credits_grant
from common import metrics
from runs import services as run_services
from runs.admission import run_admission
from runs.models import Run
from runs.plan import PlanInvalid
from schedules import selectors, services
from schedules.models import FireKind, Schedule, ScheduleFire
from schedules.services import ScheduleInvalid
from tests import factories
from tests.schedules.conftest import T0, make_schedule, scheduled_plan

pytestmark = pytest.mark.django_db

MINUTE = timedelta(minutes=1)


def fires(schedule: Schedule) -> list[tuple[Any, ...]]:
    rows = ScheduleFire.objects.filter(schedule=schedule).order_by("id")
    return [(fire.kind, fire.due_at, fire.status, fire.reason) for fire in rows]


def run_of(fire: ScheduleFire) -> Run:
    assert fire.run_id is not None
    return Run.objects.get(pk=fire.run_id)


def tick(now: datetime) -> dict[str, int]:
    return services.schedules_fire_due(now=now)


def broke() -> Organization:
    return factories.org(credits=0)


# --------------------------------------------------------------------------- create
def test_a_new_interval_schedule_is_first_due_one_interval_after_its_creation() -> None:
    schedule = make_schedule(interval="90s")

    assert (schedule.status, schedule.interval_ms, schedule.cron) == ("active", 90_000, "")
    assert schedule.next_due_at == T0 + timedelta(seconds=90)
    assert schedule.last_due_at is None


def test_a_start_is_the_anchor_and_the_first_due_time() -> None:
    start = T0 + timedelta(hours=1, seconds=7)
    schedule = make_schedule(interval="1h", start_at=start)
    assert schedule.next_due_at == start

    # A start in the past aligns the due times without catching any up.
    past = make_schedule(interval="1h", start_at=T0 - timedelta(minutes=90))
    assert past.next_due_at == T0 + timedelta(minutes=30)


def test_a_cron_schedule_is_due_by_its_time_zone() -> None:
    schedule = make_schedule(cron="30 2 * * *", timezone_name="Asia/Tokyo")

    assert schedule.next_due_at == datetime(2026, 5, 1, 17, 30, tzinfo=UTC)  # 02:30 JST
    assert schedule.timezone == "Asia/Tokyo"


@pytest.mark.parametrize(
    ("fields", "path", "code", "message"),
    [
        ({"cron": "61 * * * *", "interval": None}, "cron", "invalid_cron", "minute: '61'"),
        ({"cron": "0 0 30 2 *", "interval": None}, "cron", "invalid_cron", "matches no date"),
        ({"interval": "0.5s"}, "interval", "invalid_interval", "at least 1s"),
        ({"interval": "soon"}, "interval", "invalid_interval", "must be a duration"),
        ({"interval": True}, "interval", "invalid_interval", "must be a duration"),
        ({"cron": "* * * * *", "interval": "1m"}, "interval", "invalid", "not both"),
        ({"interval": None}, "cron", "required", "either cron or interval"),
        ({"timezone_name": "Mars/Olympus"}, "timezone", "invalid_timezone", "IANA"),
        ({"start_at": T0, "end_at": T0}, "end_at", "invalid", "after start_at"),
        ({"end_at": T0 - MINUTE}, "end_at", "invalid", "in the future"),
        ({"end_at": T0 + timedelta(seconds=30)}, "end_at", "no_due_time", "no due time"),
        ({"start_at": datetime(1969, 1, 1, tzinfo=UTC)}, "start_at", "out_of_range", "1970"),
        ({"overlap": "sometimes"}, "overlap", "invalid_choice", "skip, allow, cancel_previous"),
        ({"catchup": "some"}, "catchup", "invalid_choice", "none, latest, all"),
        ({"variables": ["x"]}, "variables", "invalid", "must be an object"),
        ({"name": "  "}, "name", "invalid", "1 to 200 characters"),
    ],
)
def test_each_problem_is_refused_with_its_path_and_code_and_nothing_is_stored(
    fields: dict[str, Any], path: str, code: str, message: str
) -> None:
    fields = {"interval": "1m", **fields}  # interval None: not given

    with pytest.raises(ScheduleInvalid) as refused:
        make_schedule(**fields)

    (problem,) = refused.value.problems
    assert (problem.path, problem.code) == (path, code)
    assert message in problem.message
    assert not Schedule.objects.exists()


def test_the_plan_is_checked_with_the_schedules_variables_and_its_problems_are_under_plan() -> None:
    plan = scheduled_plan()
    plan["agents"][0]["tasks"][0]["steps"][0].update(
        tool="echo", params={"day": "${variables.day}"}
    )

    with pytest.raises(PlanInvalid) as refused:
        make_schedule(plan=plan)
    assert [error.path for error in refused.value.errors] == [
        "plan.agents[0].tasks[0].steps[0].params.day"
    ]
    with pytest.raises(PlanInvalid) as broken:
        make_schedule(plan={"name": "no-agents"})
    assert broken.value.errors[0].path.startswith("plan")

    schedule = make_schedule(plan=plan, variables={"day": "monday"})
    assert schedule.plan == plan  # as submitted; the variables are laid over at each run
    assert not Schedule.objects.exclude(pk=schedule.pk).exists()


# --------------------------------------------------------------------------- firing
def test_a_due_time_starts_a_run_of_the_plan_with_the_schedules_variables() -> None:
    plan = scheduled_plan(variables={"day": "sunday", "region": "eu"})
    schedule = make_schedule(plan=plan, variables={"day": "monday"})

    assert tick(T0 + 30 * timedelta(seconds=1)) == {}  # not due yet
    counts = tick(T0 + MINUTE + timedelta(seconds=1))

    assert counts == {"fired": 1}
    assert fires(schedule) == [("scheduled", T0 + MINUTE, "fired", "")]
    run = run_of(ScheduleFire.objects.get())
    assert (run.status, run.created_by) == ("pending", f"schedule:{schedule.pk}")
    assert run.variables == {"day": "monday", "region": "eu"}
    schedule.refresh_from_db()
    assert (schedule.last_due_at, schedule.next_due_at) == (T0 + MINUTE, T0 + 2 * MINUTE)
    shown = selectors.schedule_get(organization=schedule.organization, schedule_id=schedule.pk)
    assert (shown.last_run_id, shown.last_run_status) == (run.pk, "pending")  # type: ignore[attr-defined]


def test_a_due_time_is_fired_once_however_many_ticks_reach_it() -> None:
    schedule = make_schedule(overlap="allow")
    now = T0 + MINUTE + timedelta(seconds=1)

    tick(now)
    tick(now)
    # A tick whose view of the schedule is stale (its commit lost, retried by Celery)
    # meets PostgreSQL's unique (schedule, due time): no second fire, no second run.
    Schedule.objects.filter(pk=schedule.pk).update(next_due_at=T0 + MINUTE)
    assert services.schedule_fire_due(schedule_id=schedule.pk, now=now) == {}

    assert fires(schedule) == [("scheduled", T0 + MINUTE, "fired", "")]
    assert Run.objects.count() == 1
    with pytest.raises(IntegrityError), transaction.atomic():
        ScheduleFire.objects.create(
            schedule=schedule, kind=FireKind.SCHEDULED, due_at=T0 + MINUTE, status="fired"
        )


def test_overlap_skip_records_the_due_time_skipped_while_the_previous_run_goes_on() -> None:
    schedule = make_schedule()  # overlap: skip
    tick(T0 + MINUTE)
    first = Run.objects.get()

    tick(T0 + 2 * MINUTE)
    run_services.run_cancel(run_id=first.pk, reason="done with it")
    tick(T0 + 3 * MINUTE)

    assert fires(schedule) == [
        ("scheduled", T0 + MINUTE, "fired", ""),
        ("scheduled", T0 + 2 * MINUTE, "skipped", "overlap"),
        ("scheduled", T0 + 3 * MINUTE, "fired", ""),
    ]
    skipped = ScheduleFire.objects.get(reason="overlap")
    assert skipped.message == f"run {first.pk} of this schedule is still pending"
    assert Run.objects.count() == 2
    # The ended run was marked so by the check that saw it ended: not read again.
    assert ScheduleFire.objects.get(run=first).run_ended


def test_overlap_allow_starts_runs_side_by_side() -> None:
    schedule = make_schedule(overlap="allow")

    for minute in (1, 2, 3):
        tick(T0 + minute * MINUTE)

    assert [fire[2] for fire in fires(schedule)] == ["fired"] * 3
    assert Run.objects.filter(status="pending").count() == 3


def test_overlap_cancel_previous_cancels_the_runs_still_going_then_starts_one() -> None:
    schedule = make_schedule(overlap="cancel_previous")
    tick(T0 + MINUTE)
    tick(T0 + 2 * MINUTE)

    first, second = Run.objects.order_by("created_at")
    assert (first.status, second.status) == ("cancelled", "pending")
    assert "replaced by the run of schedule 'every-minute' due at" in first.cancel_reason
    assert [fire[2] for fire in fires(schedule)] == ["fired", "fired"]


def test_a_replacement_that_cannot_start_leaves_the_previous_run_going() -> None:
    schedule = make_schedule(overlap="cancel_previous")
    tick(T0 + MINUTE)
    broken = scheduled_plan()
    broken["agents"][0]["tasks"][0]["steps"][0]["tool"] = "no-such-tool"
    Schedule.objects.filter(pk=schedule.pk).update(plan=broken)

    tick(T0 + 2 * MINUTE)

    assert Run.objects.get().status == "pending"  # not cancelled for nothing
    assert fires(schedule)[-1] == ("scheduled", T0 + 2 * MINUTE, "skipped", "invalid_plan")


def test_a_replacement_may_use_the_credits_its_cancel_gives_back() -> None:
    organization = factories.org(credits="0.03")  # one run's reservation, no more
    schedule = make_schedule(organization, overlap="cancel_previous")
    tick(T0 + MINUTE)

    tick(T0 + 2 * MINUTE)

    first, second = Run.objects.order_by("created_at")
    assert (first.status, second.status) == ("cancelled", "pending")
    assert [fire[2] for fire in fires(schedule)] == ["fired", "fired"]


def test_without_credits_a_due_time_is_skipped_with_the_reason_and_the_schedule_goes_on() -> None:
    organization = broke()
    schedule = make_schedule(organization)

    assert tick(T0 + MINUTE) == {"skipped": 1}
    credits_grant(organization=organization, amount=10, reason="top-up")
    assert tick(T0 + 2 * MINUTE) == {"fired": 1}

    assert fires(schedule) == [
        ("scheduled", T0 + MINUTE, "skipped", "insufficient_credits"),
        ("scheduled", T0 + 2 * MINUTE, "fired", ""),
    ]
    skipped = ScheduleFire.objects.get(status="skipped")
    assert skipped.message == "needs 0.030000 credits, 0.000000 available"
    assert skipped.run_id is None
    assert Run.objects.count() == 1  # the refused run was rolled back, not left CREATED


def test_refused_for_credits_ten_times_in_a_row_a_schedule_pauses_itself() -> None:
    schedule = make_schedule(broke())

    for minutes in range(1, 10):
        assert tick(T0 + minutes * MINUTE) == {"skipped": 1}
    assert Schedule.objects.get().credit_refusals == 9
    assert Schedule.objects.get().status == "active"
    assert tick(T0 + 10 * MINUTE) == {"skipped": 1}

    paused = Schedule.objects.get()
    assert (paused.status, paused.paused_reason, paused.credit_refusals) == (
        "paused",
        "insufficient_credits",
        10,
    )
    assert paused.paused_at == T0 + 10 * MINUTE
    last = ScheduleFire.objects.latest("id")
    assert last.message.endswith("; paused after 10 refusals for credits in a row")
    # Paused: no more refusals recorded, every second or every minute.
    assert tick(T0 + 20 * MINUTE) == {}
    assert ScheduleFire.objects.filter(schedule=schedule).count() == 10
    # Resumed (credits there or not), it counts from 0 again.
    resumed = services.schedule_resume(schedule_id=schedule.pk, now=T0 + 20 * MINUTE)
    assert (resumed.status, resumed.paused_reason, resumed.credit_refusals) == ("active", "", 0)


def test_a_run_started_sets_the_count_of_refusals_back_to_zero() -> None:
    organization = broke()
    schedule = make_schedule(organization, overlap="allow")
    for minutes in range(1, 10):
        tick(T0 + minutes * MINUTE)
    credits_grant(organization=organization, amount="0.03", reason="one run's worth")

    assert tick(T0 + 10 * MINUTE) == {"fired": 1}
    assert Schedule.objects.get().credit_refusals == 0
    for minutes in range(11, 20):
        assert tick(T0 + minutes * MINUTE) == {"skipped": 1}
    assert Schedule.objects.get().status == "active"  # 9 in a row, not 10
    assert tick(T0 + 20 * MINUTE) == {"skipped": 1}
    assert Schedule.objects.get().paused_reason == "insufficient_credits"
    assert schedule.pk == Schedule.objects.get().pk


def test_other_refusals_neither_count_nor_reset_the_refusals_for_credits() -> None:
    schedule = make_schedule(broke())
    Schedule.objects.filter(pk=schedule.pk).update(credit_refusals=3)
    broken = scheduled_plan()
    broken["agents"][0]["tasks"][0]["steps"][0]["tool"] = "no-such-tool"
    Schedule.objects.filter(pk=schedule.pk).update(plan=broken)

    assert tick(T0 + MINUTE) == {"skipped": 1}
    assert Schedule.objects.get().credit_refusals == 3


def test_a_manual_pause_says_so_and_a_trigger_resets_the_refusals() -> None:
    organization = broke()
    schedule = make_schedule(organization)
    tick(T0 + MINUTE)
    credits_grant(organization=organization, amount=10, reason="top-up")

    services.schedule_trigger(schedule_id=schedule.pk, now=T0 + 2 * MINUTE)
    assert Schedule.objects.get().credit_refusals == 0
    paused = services.schedule_pause(schedule_id=schedule.pk)
    assert (paused.status, paused.paused_reason) == ("paused", "manual")


def test_beyond_the_organizations_pending_runs_a_due_time_is_skipped() -> None:
    organization = factories.org()
    run_admission.limits_set(organization.pk, actor="test", max_pending_runs=1)
    schedule = make_schedule(organization, overlap="allow")

    tick(T0 + MINUTE)
    tick(T0 + 2 * MINUTE)

    assert fires(schedule)[-1] == ("scheduled", T0 + 2 * MINUTE, "skipped", "too_many_pending_runs")


def test_a_plan_that_no_longer_validates_is_skipped_as_invalid_plan() -> None:
    schedule = make_schedule()
    broken = scheduled_plan()
    broken["agents"][0]["tasks"][0]["steps"][0]["tool"] = "no-such-tool"
    Schedule.objects.filter(pk=schedule.pk).update(plan=broken)  # validated when stored

    tick(T0 + MINUTE)

    assert fires(schedule) == [("scheduled", T0 + MINUTE, "skipped", "invalid_plan")]
    assert "no-such-tool" in ScheduleFire.objects.get().message


def test_one_broken_schedule_does_not_stop_the_tick_for_the_others(
    caplog: pytest.LogCaptureFixture,
) -> None:
    broken, fine = make_schedule(), make_schedule()
    Schedule.objects.filter(pk=broken.pk).update(timezone="Atlantis/Capital")

    counts = tick(T0 + MINUTE)

    assert counts == {"fired": 1, "errors": 1}
    assert fires(fine) == [("scheduled", T0 + MINUTE, "fired", "")]
    assert f"schedule {broken.pk} could not be fired" in caplog.text


# --------------------------------------------------------------------------- catch-up
# Beat down from T0 + 1 min to T0 + 1 h + 20 s: 60 due times passed.
BACK = T0 + timedelta(hours=1, seconds=20)


# --------------------------------------------------------------------------- metrics
def fires_counted() -> dict[str, float]:
    """``orchestrator_schedule_fires_total`` as Redis holds it: "kind|outcome" -> count."""
    raw = metrics.connection().hgetall(metrics.SCHEDULE_FIRES)
    return {field.decode(): float(count) for field, count in raw.items()}


def test_every_fire_is_counted_for_prometheus_by_kind_and_outcome_once_committed(
    django_capture_on_commit_callbacks: Any,
) -> None:
    before = fires_counted()
    schedule = make_schedule()  # overlap: skip, catchup: none
    broken = make_schedule()
    Schedule.objects.filter(pk=broken.pk).update(timezone="Atlantis/Capital")
    refused = make_schedule(broke())

    with django_capture_on_commit_callbacks(execute=True):
        tick(BACK)  # 59 due times missed and one fired; the broken schedule fails
        Schedule.objects.filter(pk__in=[broken.pk, refused.pk]).update(paused_at=BACK)
        tick(BACK + MINUTE)  # the run of the last is still pending: skipped (overlap)
        services.schedule_trigger(schedule_id=schedule.pk)
        with pytest.raises(InsufficientCredits):
            services.schedule_trigger(schedule_id=refused.pk)  # rolled back: not counted

    after = fires_counted()
    grew = {key: after[key] - before.get(key, 0) for key in after}
    assert {key: count for key, count in grew.items() if count} == {
        "scheduled|missed": 59 + 59,
        "scheduled|fired": 1,
        "scheduled|insufficient_credits": 1,
        "scheduled|overlap": 1,
        "scheduled|error": 1,
        "manual|fired": 1,
    }


def test_catchup_none_runs_only_a_due_time_still_on_time_and_records_the_missed_ones() -> None:
    schedule = make_schedule(overlap="allow")

    assert tick(BACK) == {"fired": 1, "missed": 59}

    assert fires(schedule) == [
        ("scheduled", T0 + 59 * MINUTE, "skipped", "missed"),
        ("scheduled", T0 + 60 * MINUTE, "fired", ""),
    ]
    missed = ScheduleFire.objects.get(reason="missed")
    assert missed.message.startswith("59 due times from 2026-05-01T12:01:00+00:00 to ")
    assert "catchup none" in missed.message
    schedule.refresh_from_db()
    assert (schedule.last_due_at, schedule.next_due_at) == (T0 + 60 * MINUTE, T0 + 61 * MINUTE)


def test_catchup_none_beyond_the_grace_runs_nothing(settings: Any) -> None:
    settings.SCHEDULES_MISFIRE_GRACE = 10
    schedule = make_schedule(overlap="allow")

    assert tick(BACK) == {"missed": 60}
    assert fires(schedule) == [("scheduled", T0 + 60 * MINUTE, "skipped", "missed")]
    assert not Run.objects.exists()


def test_catchup_latest_runs_once_for_everything_missed(settings: Any) -> None:
    settings.SCHEDULES_MISFIRE_GRACE = 10
    schedule = make_schedule(overlap="allow", catchup="latest")

    assert tick(BACK) == {"fired": 1, "missed": 59}
    assert fires(schedule)[-1] == ("scheduled", T0 + 60 * MINUTE, "fired", "")


def test_catchup_all_runs_each_missed_time_up_to_the_bound(settings: Any) -> None:
    settings.SCHEDULES_CATCHUP_MAX = 5
    schedule = make_schedule(overlap="allow", catchup="all")

    assert tick(BACK) == {"fired": 5, "missed": 55}

    assert [fire[1:3] for fire in fires(schedule)] == [
        (T0 + 55 * MINUTE, "skipped"),
        *((T0 + minute * MINUTE, "fired") for minute in range(56, 61)),
    ]
    assert Run.objects.count() == 5


def test_catchup_all_with_overlap_skip_runs_the_oldest_and_skips_the_rest() -> None:
    schedule = make_schedule(catchup="all")

    tick(T0 + 3 * MINUTE + timedelta(seconds=5))

    assert [fire[2:] for fire in fires(schedule)] == [
        ("fired", ""),
        ("skipped", "overlap"),
        ("skipped", "overlap"),
    ]


# --------------------------------------------------------------------------- DST, ticking
NEW_YORK_SPRING = datetime(2026, 3, 8, 7, 0, tzinfo=UTC)  # 03:00 EDT, the clocks just changed


def test_a_skipped_local_time_runs_once_at_the_next_valid_instant() -> None:
    created = datetime(2026, 3, 7, 12, tzinfo=UTC)
    schedule = make_schedule(cron="30 2 * * *", timezone_name="America/New_York", now=created)
    assert schedule.next_due_at == datetime(2026, 3, 8, 7, 0, tzinfo=UTC)  # 02:30 -> 03:00 EDT

    for seconds in (1, 2, 1800, 3600):
        tick(NEW_YORK_SPRING + timedelta(seconds=seconds))

    assert fires(schedule) == [("scheduled", NEW_YORK_SPRING, "fired", "")]
    schedule.refresh_from_db()
    assert schedule.next_due_at == datetime(2026, 3, 9, 6, 30, tzinfo=UTC)  # 02:30 EDT


def test_a_repeated_local_time_runs_once() -> None:
    created = datetime(2026, 10, 31, 12, tzinfo=UTC)
    schedule = make_schedule(
        cron="30 1 * * *", timezone_name="America/New_York", now=created, overlap="allow"
    )
    first = datetime(2026, 11, 1, 5, 30, tzinfo=UTC)  # 01:30 EDT
    assert schedule.next_due_at == first

    tick(first + timedelta(seconds=1))
    tick(first + timedelta(hours=1, seconds=1))  # 01:30 EST, the same wall-clock time again

    assert fires(schedule) == [("scheduled", first, "fired", "")]
    schedule.refresh_from_db()
    assert schedule.next_due_at == datetime(2026, 11, 2, 6, 30, tzinfo=UTC)  # 01:30 EST


# --------------------------------------------------------------------------- control
def test_a_paused_schedule_fires_nothing_and_resumes_from_the_next_due_time() -> None:
    schedule = make_schedule()
    services.schedule_pause(schedule_id=schedule.pk, now=T0 + timedelta(seconds=10))

    assert tick(T0 + 10 * MINUTE) == {}
    resumed = services.schedule_resume(
        schedule_id=schedule.pk, now=T0 + 10 * MINUTE + timedelta(seconds=5)
    )

    assert (resumed.status, resumed.next_due_at) == ("active", T0 + 11 * MINUTE)
    assert not ScheduleFire.objects.exists()  # the paused times are not recorded
    assert services.schedule_pause(schedule_id=schedule.pk).status == "paused"
    again = services.schedule_pause(schedule_id=schedule.pk)
    assert again.paused_at == Schedule.objects.get().paused_at


def test_a_trigger_starts_a_run_now_even_while_paused() -> None:
    schedule = make_schedule()
    services.schedule_pause(schedule_id=schedule.pk)

    fire = services.schedule_trigger(schedule_id=schedule.pk, actor="api:ops", now=T0 + MINUTE)

    assert (fire.kind, fire.status, fire.due_at) == ("manual", "fired", T0 + MINUTE)
    assert fire.message == "triggered by api:ops"
    assert Run.objects.get().pk == fire.run_id
    # A trigger is no due time: the due time at the same instant still fires.
    services.schedule_resume(schedule_id=schedule.pk, now=T0)
    Schedule.objects.filter(pk=schedule.pk).update(overlap="allow")
    tick(T0 + MINUTE)
    assert [fire[0] for fire in fires(schedule)] == ["manual", "scheduled"]


def test_a_trigger_the_credits_refuse_raises_and_records_nothing() -> None:
    schedule = make_schedule(broke())

    with pytest.raises(InsufficientCredits):
        services.schedule_trigger(schedule_id=schedule.pk)

    assert not ScheduleFire.objects.exists()
    assert not Run.objects.exists()


def test_a_trigger_with_cancel_previous_replaces_the_run_going_on() -> None:
    schedule = make_schedule(overlap="cancel_previous")
    first = services.schedule_trigger(schedule_id=schedule.pk)
    second = services.schedule_trigger(schedule_id=schedule.pk)

    assert run_of(first).status == "cancelled"
    assert run_of(second).status == "pending"


def test_a_change_of_timing_takes_effect_from_now() -> None:
    schedule = make_schedule()
    later = T0 + timedelta(minutes=10, seconds=30)

    changed = services.schedule_update(schedule_id=schedule.pk, interval="5m", now=later)
    assert (changed.interval_ms, changed.next_due_at) == (300_000, T0 + 15 * MINUTE)

    to_cron = services.schedule_update(schedule_id=schedule.pk, cron="0 * * * *", now=later)
    assert (to_cron.cron, to_cron.interval_ms, to_cron.next_due_at) == (
        "0 * * * *",
        None,
        T0 + timedelta(hours=1),
    )
    renamed = services.schedule_update(schedule_id=schedule.pk, name="hourly", now=later)
    assert (renamed.name, renamed.next_due_at) == ("hourly", T0 + timedelta(hours=1))


def test_an_update_is_checked_like_a_create_and_changes_nothing_on_a_problem() -> None:
    schedule = make_schedule()

    with pytest.raises(ScheduleInvalid):
        services.schedule_update(schedule_id=schedule.pk, name="x", timezone_name="Nowhere")
    with pytest.raises(PlanInvalid):
        services.schedule_update(schedule_id=schedule.pk, name="x", plan={"name": "bad"})

    assert Schedule.objects.get().name == "every-minute"


def test_after_its_end_a_schedule_has_ended() -> None:
    schedule = make_schedule(end_at=T0 + 2 * MINUTE)

    tick(T0 + MINUTE)
    Run.objects.update(status="completed")
    tick(T0 + 2 * MINUTE)
    schedule.refresh_from_db()

    assert (schedule.status, schedule.next_due_at, schedule.last_due_at) == (
        "ended",
        None,
        T0 + 2 * MINUTE,
    )
    assert tick(T0 + 10 * MINUTE) == {}


def test_a_deleted_schedule_takes_its_fires_and_leaves_its_runs() -> None:
    schedule = make_schedule()
    tick(T0 + MINUTE)

    services.schedule_delete(schedule_id=schedule.pk)

    assert not ScheduleFire.objects.exists()
    assert Run.objects.count() == 1
    with pytest.raises(services.ScheduleNotFound):
        services.schedule_delete(schedule_id=schedule.pk)


def test_another_organizations_schedule_is_not_found() -> None:
    schedule = make_schedule()
    stranger = factories.org()

    for operation in (
        services.schedule_pause,
        services.schedule_resume,
        services.schedule_delete,
        services.schedule_trigger,
    ):
        with pytest.raises(services.ScheduleNotFound):
            operation(schedule_id=schedule.pk, organization=stranger)
    with pytest.raises(services.ScheduleNotFound):
        selectors.schedule_get(organization=stranger, schedule_id=schedule.pk)
    with pytest.raises(services.ScheduleNotFound):
        selectors.schedule_get(organization=None, schedule_id="not-a-uuid")
    assert Schedule.objects.get().status == "active"


def test_an_interval_reads_as_the_plans_durations_do() -> None:
    for written, ms in (("30s", 30_000), (" 1.5h ", 5_400_000), (90, 90_000), (2.5, 2_500)):
        assert make_schedule(interval=written).interval_ms == ms


def test_the_runs_of_a_schedule_are_listed_by_it() -> None:
    schedule, other = make_schedule(overlap="allow"), make_schedule(overlap="allow")
    organization = schedule.organization
    tick(T0 + MINUTE)
    tick(T0 + 2 * MINUTE)
    factories.run(organization)  # not scheduled

    mine = selectors.run_list(organization=organization, query={"schedule": str(schedule.pk)})
    theirs = selectors.run_list(organization=organization, query={"schedule": str(other.pk)})

    assert {run.pk for run in mine} == set(
        ScheduleFire.objects.filter(schedule=schedule).values_list("run_id", flat=True)
    )
    assert len(mine) == 2
    assert not theirs.exists()  # another organization's schedule: none of these runs
