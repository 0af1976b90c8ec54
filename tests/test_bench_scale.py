"""The scale mode's fleets and table (bench/scale.py): what SCALE_SET accepts and refuses,
and a row per fleet with its ratios. Measuring is the benchmark's, not the suite's."""

from __future__ import annotations

import pytest

from bench.scale import Fleet, Row, parse_set, table


def test_a_scale_set_names_processes_by_children() -> None:
    assert parse_set("1x4 2x4, 12X4") == [Fleet(1, 4), Fleet(2, 4), Fleet(12, 4)]
    assert Fleet(12, 4).slots == 48


@pytest.mark.parametrize("text", ["", "4", "4x", "x4", "0x4", "4x0", "2y4", "-1x4"])
def test_a_scale_set_that_is_not_processes_by_children_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match=r"processes x children|no fleet"):
        parse_set(text)


def test_the_table_has_a_row_per_fleet_with_its_ratios() -> None:
    row = Row(Fleet(2, 4))
    row.figures.update(
        fan_2000_wall_s=1.0,
        group_2000_wall_s=2.0,
        many_runs_runs_per_s=90.0,
        many_chains_runs_per_s=100.0,
        fan_sleep_efficiency=0.9,
    )

    lines = table([row, Row(Fleet(1, 4))]).splitlines()

    assert lines[0].split()[:2] == ["fleet", "slots"]
    assert lines[2].split()[:2] == ["2x4", "8"]
    assert "0.50x" in lines[2]
    assert "0.90x" in lines[2]
    assert lines[3].split()[2] == "-"  # a fleet without figures shows none
