"""Lower priority numbers are served first (the Redis transport's priority lists)."""

from __future__ import annotations

import pytest
from django.utils import timezone

from config.celery import QUEUE_RUNS_HIGH, QUEUE_RUNS_NORMAL, app
from orchestrator.dispatch import run_queue
from runs import services
from runs.models import Run
from tests import factories
from tests.integration.engine_support import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def test_queued_runs_are_picked_up_lowest_priority_number_first(celery_worker: str) -> None:
    organization = factories.org()
    queues = [QUEUE_RUNS_NORMAL, QUEUE_RUNS_HIGH]
    for queue in queues:
        app.control.cancel_consumer(queue, destination=[celery_worker], reply=True)
    try:
        runs = []
        for priority in (8, 6, 4, 3):  # submitted worst first; all on runs.normal
            run = services.run_create(
                organization=organization, spec=factories.plan(priority=priority)
            )
            runs.append(services.run_start(run_id=run.pk))
        assert {run_queue(r.priority) for r in runs} == {QUEUE_RUNS_NORMAL}
    finally:
        for queue in queues:
            app.control.add_consumer(queue, destination=[celery_worker], reply=True)

    done = [wait_for(run) for run in runs]

    order = [r.priority for r in sorted(done, key=lambda r: r.picked_up_at or timezone.now())]
    # Two worker processes take the first two messages together, so only the ends of the
    # order are certain: the best priority among the first two, the worst last.
    assert 3 in order[:2]
    assert order[-1] == 8

    assert all(Run.objects.get(pk=r.pk).status == "completed" for r in runs)
