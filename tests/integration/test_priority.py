"""Lower priority numbers are served first, FIFO within a priority, on the real broker.

The ordering is the Redis transport's (one list per priority, polled lowest first, as
configured in CELERY_BROKER_TRANSPORT_OPTIONS); the engine's part is to publish each
run's messages with the run's priority on the queue its priority selects.
"""

from __future__ import annotations

from typing import Any

import pytest
import redis
from celery.signals import before_task_publish

from config.celery import QUEUE_RUNS_HIGH, QUEUE_RUNS_NORMAL, app
from orchestrator.transport import PICK_UP_TASK, run_queue
from runs import services
from runs.engine.start import run_start
from tests import factories

pytestmark = pytest.mark.integration


def test_the_broker_serves_lower_numbers_first_and_fifo_within_a_priority(
    broker: redis.Redis[bytes],
) -> None:
    published = [(8, "a"), (3, "b"), (5, "c"), (3, "d"), (0, "e"), (8, "f"), (5, "g")]
    with app.connection_for_write() as connection:
        queue = connection.SimpleQueue("priority-check")
        try:
            for priority, name in published:
                queue.put({"name": name}, priority=priority)
            served = []
            for _ in published:
                message = queue.get(timeout=5)
                served.append(message.payload["name"])
                message.ack()
        finally:
            queue.queue.delete()
            queue.close()

    assert served == ["e", "b", "d", "c", "g", "a", "f"]


@pytest.mark.django_db(transaction=True)
def test_a_started_run_is_published_with_its_priority_on_its_queue(settings: Any) -> None:
    settings.ORCHESTRATOR_DISPATCH_ENABLED = True
    settings.ENGINE_HIGH_PRIORITY_MAX = 2
    seen: list[tuple[str, Any]] = []

    def record(sender: str, routing_key: str, properties: dict[str, Any], **kw: Any) -> None:
        # The pick-ups only: the session's worker may have begun a run before its cancel,
        # which then publishes that run's stop to the steps' queue.
        if sender == PICK_UP_TASK:
            seen.append((routing_key, properties.get("priority")))

    organization = factories.org()
    before_task_publish.connect(record, weak=False)
    try:
        for priority in (7, 1):
            run = services.run_create(
                organization=organization, plan=factories.plan(priority=priority)
            )
            run_start(run_id=run.pk)
            services.run_cancel(run_id=run.pk)  # no worker in this test: leave nothing running
    finally:
        before_task_publish.disconnect(record)

    assert seen == [(QUEUE_RUNS_NORMAL, 7), (QUEUE_RUNS_HIGH, 1)]
    assert run_queue(0) == QUEUE_RUNS_HIGH
    assert run_queue(3) == QUEUE_RUNS_NORMAL
