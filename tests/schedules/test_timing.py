"""When a schedule is due, with the clock in the test's hands: intervals from their
anchor, cron in a time zone across daylight saving time, and what a late tick fires by
each catch-up policy. Pure functions: no database, no waiting."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given
from hypothesis import strategies as st

from schedules import timing
from schedules.cron import Cron
from schedules.timing import DueTimes, plan_catchup

NEW_YORK = ZoneInfo("America/New_York")
# 2026: clocks spring forward on 8 March at 02:00 (to 03:00), fall back on 1 November at
# 02:00 (to 01:00).
SPRING = datetime(2026, 3, 8, tzinfo=NEW_YORK)
FALL = datetime(2026, 11, 1, tzinfo=NEW_YORK)


def utc(
    year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0, us: int = 0
) -> datetime:
    return datetime(year, month, day, hour, minute, second, us, tzinfo=UTC)


def cron_times(text: str, zone: str = "America/New_York", **window: object) -> DueTimes:
    options = {"anchor": utc(2026, 1, 1), "inclusive": False, "end": None, **window}
    return DueTimes(zone=ZoneInfo(zone), cron=Cron.parse(text), **options)  # type: ignore[arg-type]


def walk(times: DueTimes, start: datetime, count: int) -> list[datetime]:
    found, moment = [], start
    for _ in range(count):
        following = times.after(moment)
        assert following is not None
        found.append(following)
        moment = following
    return found


def local(instants: list[datetime], zone: ZoneInfo = NEW_YORK) -> list[str]:
    return [instant.astimezone(zone).strftime("%m-%d %H:%M %Z") for instant in instants]


# --------------------------------------------------------------------------- intervals
def test_an_interval_counts_from_its_start_which_is_itself_due() -> None:
    start = utc(2026, 5, 1, 12)
    times = DueTimes(
        anchor=start, inclusive=True, end=None, zone=ZoneInfo("UTC"), interval=timedelta(minutes=5)
    )

    assert times.after(utc(2026, 4, 1)) == start
    assert times.after(start) == start + timedelta(minutes=5)
    assert times.after(utc(2026, 5, 1, 12, 7, 30)) == utc(2026, 5, 1, 12, 10)
    assert times.at_or_before(utc(2026, 5, 1, 12, 9, 59)) == utc(2026, 5, 1, 12, 5)
    assert times.at_or_before(start) == start
    assert times.at_or_before(start - timing.ONE) is None


def test_from_its_creation_the_first_due_time_is_one_interval_later() -> None:
    created = utc(2026, 5, 1, 12, 0, 0, 250_000)
    times = DueTimes(
        anchor=created,
        inclusive=False,
        end=None,
        zone=ZoneInfo("UTC"),
        interval=timedelta(seconds=1),
    )

    assert times.after(created) == created + timedelta(seconds=1)
    assert times.at_or_before(created) is None
    # Due times keep the anchor's phase, however late they are asked for.
    assert times.after(utc(2026, 5, 2)) == utc(2026, 5, 2, 0, 0, 0, 250_000)


def test_an_interval_is_elapsed_time_across_a_change_of_the_clocks() -> None:
    start = datetime(2026, 3, 7, 12, tzinfo=NEW_YORK)
    times = DueTimes(
        anchor=start, inclusive=True, end=None, zone=NEW_YORK, interval=timedelta(hours=24)
    )

    assert local(walk(times, start, 2)) == ["03-08 12:00 EDT", "03-09 12:00 EDT"]
    assert times.after(start) - start == timedelta(hours=24)


def test_nothing_is_due_after_the_end() -> None:
    times = DueTimes(
        anchor=utc(2026, 1, 1),
        inclusive=True,
        end=utc(2026, 1, 1, 0, 10),
        zone=ZoneInfo("UTC"),
        interval=timedelta(minutes=5),
    )

    assert times.after(utc(2026, 1, 1, 0, 5)) == utc(2026, 1, 1, 0, 10)  # the end is due
    assert times.after(utc(2026, 1, 1, 0, 10)) is None
    assert times.at_or_before(utc(2027, 1, 1)) == utc(2026, 1, 1, 0, 10)


# --------------------------------------------------------------------------- cron
def test_a_cron_is_read_in_its_time_zone() -> None:
    paris = cron_times("30 2 * * *", zone="Europe/Paris")

    assert paris.after(utc(2026, 6, 1)) == utc(2026, 6, 1, 0, 30)  # 02:30 CEST
    assert paris.after(utc(2026, 12, 1)) == utc(2026, 12, 1, 1, 30)  # 02:30 CET


def test_a_time_the_clocks_skip_runs_once_at_the_first_instant_after_the_gap() -> None:
    times = cron_times("30 2 * * *")

    due = walk(times, SPRING - timedelta(days=1), 3)

    assert local(due) == ["03-07 02:30 EST", "03-08 03:00 EDT", "03-09 02:30 EDT"]
    assert due[1] == utc(2026, 3, 8, 7)  # the instant the clocks changed


def test_every_time_skipped_collapses_into_that_one_instant() -> None:
    times = cron_times("*/20 * * * *")  # 02:00, 02:20 and 02:40 do not exist on the 8th

    due = walk(times, datetime(2026, 3, 8, 1, 30, tzinfo=NEW_YORK), 4)

    assert local(due) == [
        "03-08 01:40 EST",
        "03-08 03:00 EDT",
        "03-08 03:20 EDT",
        "03-08 03:40 EDT",
    ]


def test_a_time_that_happens_twice_runs_once_at_its_first_occurrence() -> None:
    times = cron_times("30 1 * * *")

    due = walk(times, FALL - timedelta(days=1), 3)

    assert local(due) == ["10-31 01:30 EDT", "11-01 01:30 EDT", "11-02 01:30 EST"]
    # Asked from inside the repeated hour (01:10 EST, after the first 01:30), the next
    # due time is the next day's.
    second_pass = datetime(2026, 11, 1, 1, 10, fold=1, tzinfo=NEW_YORK)
    assert local([times.after(second_pass)]) == ["11-02 01:30 EST"]  # type: ignore[list-item]


def test_the_repeated_hour_runs_nothing_its_first_pass_ran() -> None:
    times = cron_times("*/20 * * * *")

    due = walk(times, datetime(2026, 11, 1, 0, 50, tzinfo=NEW_YORK), 5)

    assert local(due) == [
        "11-01 01:00 EDT",
        "11-01 01:20 EDT",
        "11-01 01:40 EDT",
        "11-01 02:00 EST",  # an hour and twenty minutes later, by the clock on the wall
        "11-01 02:20 EST",
    ]
    inside = utc(2026, 11, 1, 6, 30)  # 01:30 EST, the second pass
    assert local([times.at_or_before(inside)]) == ["11-01 01:40 EDT"]  # type: ignore[list-item]


# A reference written the other way round: walk every minute of real time and say which
# instants are due, by the rules in words (a wall-clock time matching the cron, the first
# time it shows; the first instant after a gap that skipped a matching time).
def reference(cron: Cron, zone: ZoneInfo, start: datetime, minutes: int) -> list[datetime]:
    due = []
    previous = start.astimezone(zone).replace(tzinfo=None)
    for step in range(1, minutes + 1):
        instant = start + timedelta(minutes=step)
        shown = instant.astimezone(zone)
        wall = shown.replace(tzinfo=None)
        skipped = [
            previous + timedelta(minutes=k)
            for k in range(1, (wall - previous) // timedelta(minutes=1))
        ]
        matches = [
            moment
            for moment in [*skipped, wall]
            if cron.matches_day(moment.date())
            and moment.hour in cron.hours
            and moment.minute in cron.minutes
        ]
        if shown.fold == 0 and matches:
            due.append(instant)
        previous = max(previous, wall)
    return due


@pytest.mark.parametrize("zone", ["America/New_York", "Europe/London", "Australia/Lord_Howe"])
@pytest.mark.parametrize("text", ["*/20 * * * *", "30 1,2 * * *", "0,45 0-3 * * *", "15 2 8 3 *"])
def test_due_times_agree_with_minute_by_minute_reference_across_both_changes(
    zone: str, text: str
) -> None:
    cron, tz = Cron.parse(text), ZoneInfo(zone)
    # Lord Howe moves its clocks by 30 minutes, on the first Sundays of April and October.
    for day in ("2026-03-08", "2026-03-29", "2026-04-05", "2026-10-04", "2026-10-25", "2026-11-01"):
        start = datetime.fromisoformat(day).replace(tzinfo=tz) - timedelta(hours=6)
        start = start.astimezone(UTC)
        expected = reference(cron, tz, start, 18 * 60)
        times = cron_times(text, zone=zone)
        found = []
        moment = times.after(start)
        while moment is not None and moment <= start + timedelta(minutes=18 * 60):
            found.append(moment)
            moment = times.after(moment)
        assert found == expected, (day, local(found, tz), local(expected, tz))
        if found:  # and backwards, the same instants
            assert times.at_or_before(found[-1] + timedelta(seconds=59)) == found[-1]


@given(st.datetimes(min_value=datetime(2025, 1, 1), max_value=datetime(2028, 1, 1)))
def test_after_and_at_or_before_meet_at_every_due_time(naive: datetime) -> None:
    times = cron_times("*/7 1-3 * * *", anchor=utc(2024, 1, 1))
    moment = naive.replace(tzinfo=UTC)

    following = times.after(moment)

    assert following is not None
    assert following > moment
    assert times.at_or_before(following) == following
    assert times.at_or_before(following - timing.ONE) == times.at_or_before(moment)


def test_a_cron_that_matches_no_date_is_never_due() -> None:
    assert not timing.cron_ever_due(Cron.parse("0 0 30 2 *"))
    assert not timing.cron_ever_due(Cron.parse("0 0 31 4,6,9,11 *"))
    assert timing.cron_ever_due(Cron.parse("0 0 29 2 *"))  # leap years


def test_an_unknown_time_zone_is_refused() -> None:
    assert timing.zone_named("Europe/Paris") == ZoneInfo("Europe/Paris")
    for name in ("Mars/Olympus", "", "../etc/passwd", "utc "):
        with pytest.raises(timing.TimezoneInvalid):
            timing.zone_named(name)


# --------------------------------------------------------------------------- catch-up
EVERY_MINUTE = DueTimes(
    anchor=utc(2026, 1, 1),
    inclusive=True,
    end=None,
    zone=ZoneInfo("UTC"),
    interval=timedelta(minutes=1),
)
GRACE = timedelta(seconds=60)


def catchup(policy: str, first: datetime, now: datetime, bound: int = 100) -> timing.Catchup:
    return plan_catchup(EVERY_MINUTE, first=first, now=now, policy=policy, grace=GRACE, bound=bound)


def test_a_tick_on_time_fires_the_due_time_whatever_the_policy() -> None:
    for policy in ("none", "latest", "all"):
        plan = catchup(policy, utc(2026, 1, 1, 10), now=utc(2026, 1, 1, 10, 0, 1))

        assert plan.fire == (utc(2026, 1, 1, 10),)
        assert (plan.missed_first, plan.missed_last) == (None, None)
        assert plan.latest == utc(2026, 1, 1, 10)


def test_after_an_outage_none_fires_nothing_late_and_misses_the_rest() -> None:
    # Beat down from 10:00 to 12:30:30: 151 due times passed, the latest 30 s ago.
    plan = catchup("none", utc(2026, 1, 1, 10), now=utc(2026, 1, 1, 12, 30, 30))
    assert plan.fire == (utc(2026, 1, 1, 12, 30),)  # within the grace: on time
    assert (plan.missed_first, plan.missed_last) == (utc(2026, 1, 1, 10), utc(2026, 1, 1, 12, 29))

    strict = plan_catchup(
        EVERY_MINUTE,
        first=utc(2026, 1, 1, 10),
        now=utc(2026, 1, 1, 12, 30, 30),
        policy="none",
        grace=timedelta(seconds=10),
        bound=100,
    )
    assert strict.fire == ()  # the latest is 30 s old, beyond this grace: missed too
    assert (strict.missed_first, strict.missed_last) == (
        utc(2026, 1, 1, 10),
        utc(2026, 1, 1, 12, 30),
    )


def test_after_an_outage_latest_fires_once_for_them_all() -> None:
    plan = catchup("latest", utc(2026, 1, 1, 10), now=utc(2026, 1, 1, 12, 31, 50))

    assert plan.fire == (utc(2026, 1, 1, 12, 31),)
    assert (plan.missed_first, plan.missed_last) == (utc(2026, 1, 1, 10), utc(2026, 1, 1, 12, 30))


def test_after_an_outage_all_fires_each_oldest_first_up_to_the_bound() -> None:
    few = catchup("all", utc(2026, 1, 1, 10), now=utc(2026, 1, 1, 10, 3, 10))
    assert few.fire == tuple(utc(2026, 1, 1, 10, minute) for minute in range(4))
    assert few.missed_last is None

    many = catchup("all", utc(2026, 1, 1, 10), now=utc(2026, 1, 1, 12, 30, 10), bound=5)
    assert many.fire == tuple(utc(2026, 1, 1, 12, minute) for minute in range(26, 31))
    assert (many.missed_first, many.missed_last) == (utc(2026, 1, 1, 10), utc(2026, 1, 1, 12, 25))
    assert many.missed_first is not None
    assert many.missed_last is not None
    assert EVERY_MINUTE.count(many.missed_first, many.missed_last) == 146


def test_a_cron_outage_is_counted_by_walking_it() -> None:
    times = cron_times("0 * * * *")

    # Every hour of real time from one to the other, both included: 02:00 on the 8th,
    # which the clocks skip, is due at 03:00's instant.
    assert times.count(utc(2026, 3, 7, 0), utc(2026, 3, 9, 0)) == 49
    assert times.count(utc(2026, 3, 7, 0), utc(2026, 3, 9, 0), cap=10) == 10
