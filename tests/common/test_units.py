"""Durations and times as the admin shows them (common/units.py): the largest unit a
duration holds, and every time with its zone."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from common.units import duration_text, time_in_zone


@pytest.mark.parametrize(
    ("ms", "text"),
    [
        (0, "0 s"),
        (1, "1 ms"),
        (250, "250 ms"),
        (1000, "1 s"),
        (1500, "1.5 s"),
        (5000, "5 s"),
        (59_999, "59.999 s"),
        (60_000, "1 min"),
        (90_000, "1 min 30 s"),
        (3_600_000, "1 h"),
        (5_400_000, "1 h 30 min"),
        (86_400_000, "1 d"),
        (90_061_000, "1 d 1 h 1 min 1 s"),
        (-5000, "-5 s"),
    ],
)
def test_a_duration_reads_in_the_largest_unit_it_holds(ms: int, text: str) -> None:
    assert duration_text(ms) == text


def test_a_time_is_read_in_the_zone_it_names() -> None:
    half_past_midnight = datetime(2026, 11, 28, 0, 30, tzinfo=UTC)

    assert time_in_zone(half_past_midnight, "Europe/Paris") == "2026-11-28 01:30 Europe/Paris"
    assert time_in_zone(half_past_midnight) == "2026-11-28 00:30 UTC"
    assert time_in_zone(half_past_midnight, "UTC", seconds=True) == "2026-11-28 00:30:00 UTC"
    assert time_in_zone(None, "Europe/Paris") == "-"


def test_a_zone_this_machine_does_not_know_is_read_as_utc_and_labelled_so() -> None:
    when = datetime(2026, 11, 28, 0, 30, tzinfo=UTC)

    assert time_in_zone(when, "Atlantis/Capital") == "2026-11-28 00:30 UTC"
