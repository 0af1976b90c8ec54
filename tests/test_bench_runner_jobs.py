"""The runner_jobs scenarios (bench/runner_jobs.py) at a tiny size, through everything they
drive: the suite's Celery worker, gunicorn as `make load` starts it, an `orch worker` and
the reference runner, on the suite's PostgreSQL and Redis. Every job must be served
and the figures sane; how fast is the benchmark's business, not the suite's."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.runner_jobs import runner_jobs
from bench.scenarios import Engine
from bench.web import Web
from runs.models import RunnerJob
from tests.support import child_env

pytestmark = pytest.mark.integration

JOBS = 12


@pytest.fixture
def engine(transactional_db: None, celery_worker: str, tmp_path: Path) -> Iterator[Engine]:
    web = Web(tmp_path, workers=1, env=child_env())
    try:
        yield Engine(120.0, lambda: True, web=web)
    finally:
        web.stop()


@pytest.mark.parametrize("reference", [False, True], ids=["orch_worker", "reference_runner"])
def test_the_runner_jobs_scenario_serves_every_job_and_reports_sane_figures(
    engine: Engine, reference: bool
) -> None:
    sample = runner_jobs(engine, reference=reference, width=JOBS)

    assert sample.error is None, sample.error
    assert sample.wall_s is not None
    extra = sample.extra
    assert 0 < extra["p50_claim_to_report_ms"] <= extra["p95_claim_to_report_ms"]
    assert extra["jobs_per_s"] > 0
    served = RunnerJob.objects.filter(run__name=f"bench-runner-jobs-{JOBS}", status="completed")
    assert served.count() == JOBS
    assert {bool(job.tool) for job in served} == {not reference}
