"""Tasks travel through the real Redis broker to a real worker process and back."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from celery.backends.base import DisabledBackend
from celery.signals import before_task_publish
from django.db import transaction

from config.celery import QUEUE_RUNS_NORMAL, QUEUE_STEPS, QUEUE_SWEEPS, app
from orchestrator.tasks import echo_task
from orchestrator.transport import PICK_UP_TASK
from runs.engine.start import run_start
from runs.models import Run
from tests import factories
from tests.support import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def test_a_task_goes_through_the_broker_to_the_worker_and_back(celery_worker: str) -> None:
    payload = {"token": uuid.uuid4().hex, "n": [1, 2, 3]}

    result = echo_task.apply_async(args=(payload,)).get(timeout=30)

    assert result == {"payload": payload, "hostname": celery_worker}


def test_work_enqueued_in_a_rolled_back_transaction_never_runs(celery_worker: str) -> None:
    run = factories.run(steps=1)
    published: list[str] = []

    def record(body: Any, headers: dict[str, Any] | None = None, **kwargs: Any) -> None:
        published.append((headers or {}).get("task", ""))

    def start_then_fail() -> None:
        with transaction.atomic():
            run_start(run_id=run.pk)  # asks for a pick-up after commit
            raise RuntimeError("roll back")

    before_task_publish.connect(record, weak=False)
    try:
        with pytest.raises(RuntimeError):
            start_then_fail()
        assert published == []  # nothing was handed to the broker
        assert Run.objects.get(pk=run.pk).status == "created"

        with transaction.atomic():
            run_start(run_id=run.pk)
            assert published == []  # not before the commit either
    finally:
        before_task_publish.disconnect(record)

    assert published == [PICK_UP_TASK]
    wait_until(
        lambda: Run.objects.get(pk=run.pk).status == "completed",
        timeout=30,
        what="the committed run to be picked up and completed",
    )


@pytest.mark.parametrize(
    ("task_name", "queue"),
    [
        ("orchestrator.runs.pick_up", "runs.normal"),
        ("orchestrator.steps.execute", "steps"),
        ("orchestrator.sweeps.timeouts", "sweeps"),
        ("orchestrator.webhooks.deliver", "webhooks"),
        ("orchestrator.diagnostics.echo", "runs.normal"),
    ],
)
def test_task_names_route_to_their_queue(task_name: str, queue: str) -> None:
    route = app.amqp.router.route({}, task_name)
    assert route["queue"].name == queue
    assert {QUEUE_RUNS_NORMAL, QUEUE_STEPS, QUEUE_SWEEPS} <= set(app.amqp.queues)


def test_the_engines_tasks_have_no_result_backend() -> None:
    # Celery writes results on paths ignore_result does not cover (cancelling on a broker
    # connection loss); with Redis down that write killed the worker (make chaos).
    app.loader.import_default_modules()  # every app's tasks, as a worker loads them
    engine_tasks = [
        task
        for name, task in app.tasks.items()
        if name.startswith("orchestrator.") and name != "orchestrator.diagnostics.echo"
    ]
    assert len(engine_tasks) >= 7
    for task in engine_tasks:
        assert isinstance(task.backend, DisabledBackend), task.name
        task.backend.mark_as_retry("some-task-id", RuntimeError("cancelled"))  # stores nothing
    assert not isinstance(echo_task.backend, DisabledBackend)  # the broker probe keeps one
