"""Cron expressions read strictly: every form crontab(5) writes, and a refusal naming the
field for anything else."""

from __future__ import annotations

from datetime import date

import pytest

from schedules.cron import Cron, CronInvalid


def test_the_five_fields_with_lists_ranges_steps_and_names() -> None:
    cron = Cron.parse(" */15 9-17/4 1,15 jan-mar,DEC mon-fri ")

    assert cron.minutes == (0, 15, 30, 45)
    assert cron.hours == (9, 13, 17)
    assert cron.days == {1, 15}
    assert cron.months == {1, 2, 3, 12}
    assert cron.weekdays == {1, 2, 3, 4, 5}
    assert cron.text == "*/15 9-17/4 1,15 jan-mar,DEC mon-fri"


@pytest.mark.parametrize(
    ("macro", "fields"),
    [
        ("@yearly", "0 0 1 1 *"),
        ("@annually", "0 0 1 1 *"),
        ("@monthly", "0 0 1 * *"),
        ("@weekly", "0 0 * * 0"),
        ("@daily", "0 0 * * *"),
        ("@midnight", "0 0 * * *"),
        ("@HOURLY", "0 * * * *"),
    ],
)
def test_macros_stand_for_their_fields(macro: str, fields: str) -> None:
    assert Cron.parse(macro).__dict__ | {"text": ""} == Cron.parse(fields).__dict__ | {"text": ""}


def test_seven_is_sunday_like_zero_and_a_start_with_a_step_runs_to_the_end() -> None:
    assert Cron.parse("0 0 * * 7").weekdays == {0}
    assert Cron.parse("0 0 * * 5-7").weekdays == {5, 6, 0}
    assert Cron.parse("50/5 * * * *").minutes == (50, 55)
    assert Cron.parse("0 0 * * */2").weekdays == {0, 2, 4, 6}


def test_day_of_month_and_day_of_week_combine_as_vixie_cron_does() -> None:
    first_monday = date(2026, 6, 1)  # a Monday, the 1st
    a_monday = date(2026, 6, 8)
    the_first = date(2026, 7, 1)  # a Wednesday
    neither = date(2026, 7, 2)

    either = Cron.parse("0 9 1 * mon")  # both restricted: either matches
    both = Cron.parse("0 9 */31 * mon")  # `*...` day of month: both must match

    assert [either.matches_day(day) for day in (first_monday, a_monday, the_first, neither)] == [
        True,
        True,
        True,
        False,
    ]
    assert [both.matches_day(day) for day in (first_monday, a_monday, the_first)] == [
        True,
        False,
        False,
    ]
    assert Cron.parse("0 0 1 * *").matches_day(the_first)
    assert not Cron.parse("0 0 * 8 *").matches_day(the_first)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("* * * *", "must have 5 fields (minute hour day-of-month month day-of-week), got 4"),
        ("* * * * * *", "got 6"),
        ("", "got 0"),
        ("60 * * * *", "minute: '60' is not a number from 0 to 59"),
        ("* 24 * * *", "hour: '24' is not a number from 0 to 23"),
        ("* * 0 * *", "day of month: '0' is not a number from 1 to 31"),
        ("* * * 13 *", "month: '13' is not a number from 1 to 12 or a name (jan, feb"),
        ("* * * * 8", "day of week: '8' is not a number from 0 to 7 or a name (sun, mon"),
        ("* * * * funday", "day of week: 'funday' is not a number"),
        ("5-2 * * * *", "minute: range '5-2' runs backwards"),
        ("*/0 * * * *", "minute: step '0' is not a number from 1 to 59"),
        ("*/x * * * *", "minute: step 'x' is not a number"),
        ("1,,2 * * * *", "minute: empty item in '1,,2'"),
        ("² * * * *", "minute: '²' is not a number"),
        ("@reboot", "unknown macro '@reboot'"),
        ("*" * 201, "must be at most 200 characters"),
    ],
)
def test_anything_else_is_refused_naming_the_field(text: str, message: str) -> None:
    with pytest.raises(CronInvalid) as refused:
        Cron.parse(text)

    assert message in str(refused.value)
