"""The short chaos run: the make-chaos harness, small, as part of the suite.

About 20 runs of every shape through the REST API while worker pool children are
SIGKILLed and Redis restarts losing its data; the harness runs its own throwaway
PostgreSQL, Redis, web, two workers and beat (reliability/chaos.py). If a fault-handling
path breaks (lease reclaim, lost-message re-dispatch, idempotent claims, settlement), a
run ends stuck, lost, charged twice or with an effect run twice, and this fails.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import ROOT

pytestmark = pytest.mark.integration


def test_a_short_chaos_run_loses_nothing_and_charges_nothing_twice(tmp_path: Path) -> None:
    report_path = tmp_path / "chaos.json"
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "CELERY_BROKER_URL")}
    result = subprocess.run(
        [sys.executable, "-m", "reliability.chaos", "--short", "--seed", "7",
         "--json", str(report_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )  # fmt: skip
    assert report_path.exists(), result.stderr[-4000:]
    report = json.loads(report_path.read_text())
    summary = result.stdout[-6000:]

    consistency = report["consistency"]
    assert report["runs_created"] == report["runs_requested"] == 20, summary
    assert report["runs_in_database"] == 20, summary
    assert consistency["runs_stuck"] == [], summary
    assert consistency["ledgers_unsettled"] == [], summary
    assert consistency["step_attempts_charged_twice"] == [], summary
    assert consistency["invariants"]["clean"], summary
    assert report["side_effects"]["executed_twice"] == [], summary
    assert report["side_effects"]["phantom_attempts"] == [], summary
    assert report["side_effects"]["completed_without_effect"] == [], summary
    assert report["unexplained_outcomes"] == [], summary
    assert report["api"]["server_errors"] == [], summary
    # The faults did happen: the run proves recovery, not a quiet afternoon.
    assert report["faults_by_kind"].get("kill_worker_child", 0) >= 5, summary
    assert report["faults_by_kind"].get("restart_redis_losing_data") == 1, summary
    assert report["side_effects"]["executions"] > 0, summary
    assert report["ok"], summary
    assert result.returncode == 0, summary
