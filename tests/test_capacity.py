"""`make capacity` (bench/capacity.py, `scripts/bench.sh capacity`): on servers of its own
it measures what a step and a small run cost PostgreSQL, and its figures add up: every
step materialised is a row inserted into runs_step, every run one into runs_run, and a
process that ends inside a phase is counted once. Measuring is the tool's, not the
suite's: nothing here asserts a duration or a cost."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from bench.capacity import CORES, Cpu
from tests.support import ROOT


def test_a_server_process_that_ends_inside_a_phase_is_counted_once_and_the_monitor_never() -> None:
    before = Cpu(
        postgres={
            (1, 10): ("background", 1.0),  # the postmaster
            (2, 20): ("backends", 2.0),
            (3, 30): ("backends", 1.0),  # ends inside the phase, having used 0.5 s more
            (4, 40): ("backends", 5.0),  # the monitor's own backend
        },
        reaped=7.0,
        worker=10.0,
        driver=1.0,
        redis=0.5,
    )
    after = Cpu(
        postgres={
            (1, 10): ("background", 1.0),
            (2, 20): ("backends", 3.0),
            (5, 50): ("autovacuum", 0.5),  # began inside the phase
            (4, 40): ("backends", 9.0),
        },
        reaped=7.0 + 1.5,
        worker=12.5,
        driver=1.25,
        redis=0.75,
    )

    spent = after.since(before, skip=4)

    assert spent == {
        "background": 0.0,
        "backends": 1.0,
        "autovacuum": 0.5,
        "exited": 0.5,
        "postgres": 2.0,
        "worker": 2.5,
        "driver": 0.25,
        "redis": 0.25,
    }


@pytest.mark.timeout(600)
def test_make_capacity_measures_a_step_and_a_small_run_on_servers_of_its_own(
    tmp_path: Path,
) -> None:
    report = tmp_path / "capacity.json"
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "CELERY_BROKER_URL")}
    tiny = ["--fan", "20", "--seq", "10", "--runs", "4", "--json", str(report)]
    done = subprocess.run(
        [str(ROOT / "scripts" / "bench.sh"), "capacity", *tiny],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=540,
    )

    assert done.returncode == 0, done.stderr[-3000:]
    assert "One primary's ceiling" in done.stdout
    phases = json.loads(report.read_text())["phases"]
    assert set(phases) == {"fan", "seq", "small"}
    assert phases["fan"]["units"] == phases["fan"]["steps"] == 21  # and the join
    assert phases["seq"]["units"] == phases["seq"]["steps"] == 10
    assert (phases["small"]["units"], phases["small"]["steps"]) == (4, 20)
    for phase in phases.values():
        # The table counters are read after every backend has reported its own.
        assert phase["tables"]["runs_step"]["inserted"] == phase["steps"]
        assert phase["tables"]["runs_run"]["inserted"] == (4 if phase["unit"] == "run" else 1)
        recordings = [s for s in phase["statements"] if "runs.step_completed" in s["query"]]
        assert recordings
        assert recordings[0]["calls"] > 0
        per_unit = phase["per_unit"]
        assert per_unit["wal_bytes"] >= per_unit["wal_bytes_without_pages"] > 0
        assert per_unit["wal_records"] > 0
        bounds = [phase["ceiling"][str(cores)]["per_s"] for cores in CORES]
        assert bounds[1] == pytest.approx(bounds[0] * CORES[1] / CORES[0])
    assert sum(phase["cpu_s"]["postgres"] for phase in phases.values()) > 0
    assert sum(phase["cpu_s"]["worker"] for phase in phases.values()) > 0
