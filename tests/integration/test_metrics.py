"""/metrics scraped during a run on a real worker: the worker's counters (kept in the
broker's Redis) move while the run does, and the exposition parses with Prometheus's
text parser."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from runs.models import Step
from tests import factories
from tests.integration.engine_support import submit, wait_for
from tests.support import wait_until
from tests.web.test_prometheus import TOKEN, scrape, value

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

STEPS = 12


def test_the_workers_counters_move_during_a_run(celery_worker: str, settings: Any) -> None:
    settings.METRICS_TOKEN = TOKEN
    client = Client()
    plan = factories.plan(steps=STEPS)
    for step in plan["agents"][0]["tasks"][0]["steps"]:
        step.update(tool="sleep", params={"seconds": 0.25})
    attempts = {"tool": "sleep", "outcome": "completed"}
    before = scrape(client)

    run = submit(plan)
    wait_until(
        lambda: Step.objects.filter(run=run, status="completed").count() >= 3,
        timeout=30,
        what="three steps done",
    )
    during = wait_until(
        lambda: (
            found
            if value(found := scrape(client), "orchestrator_step_attempts_total", **attempts)
            > value(before, "orchestrator_step_attempts_total", **attempts)
            else None
        ),
        timeout=15,
        what="the counters to move while the run runs",
    )
    assert Step.objects.filter(run=run).exclude(status="completed").exists()
    assert wait_for(run).status == "completed"
    # The worker sends what it summed within a second or two (common.metrics).
    after = wait_until(
        lambda: (
            found
            if value(found := scrape(client), "orchestrator_step_attempts_total", **attempts)
            - value(before, "orchestrator_step_attempts_total", **attempts)
            >= STEPS
            else None
        ),
        timeout=15,
        what="the worker's counters to reach the run's steps",
    )

    # The session's worker serves every integration test of this process, and sums a
    # step's figures for up to a second before it sends them (common.metrics): what an
    # earlier test's steps left unsent can land after `before`. Each counter is therefore
    # held to at least this run's share; that each attempt counts exactly once is
    # tests/web/test_prometheus.py's, in one process.
    started = value(before, "orchestrator_step_attempts_total", **attempts)
    midway = value(during, "orchestrator_step_attempts_total", **attempts)
    ended = value(after, "orchestrator_step_attempts_total", **attempts)
    assert started < midway < ended
    assert ended - started >= STEPS
    durations = "orchestrator_step_duration_seconds"
    grew = value(after, f"{durations}_count", tool="sleep") - value(
        before, f"{durations}_count", tool="sleep"
    )
    assert grew >= STEPS
    # Each step slept a quarter of a second: the durations are the tools' own.
    slept = value(after, f"{durations}_sum", tool="sleep") - value(
        before, f"{durations}_sum", tool="sleep"
    )
    assert slept >= STEPS * 0.25
    waits = "orchestrator_step_queue_wait_seconds_count"
    assert value(after, waits, tool="sleep") - value(before, waits, tool="sleep") >= STEPS
    assert value(after, "orchestrator_runs", status="completed") >= 1
