"""The Celery application: queues, routes and the after-commit enqueue helper.

Settings prefixed ``CELERY_`` in Django settings configure the app (see
``config/settings/broker.py`` for the reliability block); what is structural, the queues
and the routing of task names onto them, is declared here in code.
"""

from __future__ import annotations

import os
from typing import Any

from celery import Celery
from celery.signals import (
    task_prerun,
    worker_process_init,
    worker_process_shutdown,
    worker_ready,
    worker_shutdown,
)
from django.conf import settings
from kombu import Queue

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.production")

QUEUE_RUNS_HIGH = "runs.high_priority"
QUEUE_RUNS_NORMAL = "runs.normal"
QUEUE_STEPS = "steps"
QUEUE_SWEEPS = "sweeps"
# Run webhooks' sweep and sends (docs/webhooks.md): a queue of their own, consumed only
# by the `webhooks` process (Procfile: a pool of threads, many sends at once), never by
# the workers that run steps: a receiver, slow or dripping, holds none of their slots.
QUEUE_WEBHOOKS = "webhooks"
# What the `worker` processes consume (Procfile, the tests' worker).
WORKER_QUEUES = (QUEUE_RUNS_HIGH, QUEUE_RUNS_NORMAL, QUEUE_STEPS, QUEUE_SWEEPS)
ALL_QUEUES = (*WORKER_QUEUES, QUEUE_WEBHOOKS)
# Beat records its last tick here (orchestrator.beat), and `/healthz` reads it
# (web.health): the one sign that beat is alive is beat saying so.
BEAT_TICK_KEY = "orchestrator:beat:last_tick"


def queue_keys(queue: str) -> list[str]:
    """The Redis lists of a queue: kombu keeps one per priority step (the first is the
    queue's own name). The worker's transport reads the steps queue's depth from them,
    the dashboard and `GET /metrics` every queue's."""
    options: dict[str, Any] = settings.CELERY_BROKER_TRANSPORT_OPTIONS
    sep = options.get("sep", "\x06\x16")
    return [queue if step == 0 else f"{queue}{sep}{step}" for step in options["priority_steps"]]


app = Celery("orchestrator")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.update(
    task_queues=tuple(Queue(name, routing_key=name) for name in ALL_QUEUES),
    task_default_queue=QUEUE_RUNS_NORMAL,
    task_default_routing_key=QUEUE_RUNS_NORMAL,
    # Task names carry their kind: `orchestrator.runs.*`, `orchestrator.steps.*`,
    # `orchestrator.sweeps.*`. A run's high-priority queue is chosen per message by the
    # caller, everything else follows its name.
    task_routes={
        "orchestrator.runs.*": {"queue": QUEUE_RUNS_NORMAL},
        "orchestrator.steps.*": {"queue": QUEUE_STEPS},
        "orchestrator.sweeps.*": {"queue": QUEUE_SWEEPS},
        "orchestrator.webhooks.*": {"queue": QUEUE_WEBHOOKS},
    },
)
app.autodiscover_tasks()


@task_prerun.connect
def _drop_stale_connections(**kwargs: Any) -> None:
    """Before each task, close database connections that broke or outlived their age.

    With CELERY_DB_REUSE_MAX set, Celery no longer closes them itself; Django's own
    per-request housekeeping does not run in a worker. A connection a task before this
    one left mid-query (interrupted by its soft time limit, or a revoke) has its query
    cancelled first: closed alone, an old connection would leave the query running on
    the server until it ended.
    """
    from django.db import close_old_connections

    from common.connections import discard_interrupted_connection

    discard_interrupted_connection()
    close_old_connections()


@worker_process_init.connect
def _start_tracing(**kwargs: Any) -> None:
    """Each pool process exports its own spans (the SDK's export thread does not survive
    a fork): set up after it, when OTEL_EXPORTER_OTLP_ENDPOINT is set (config.otel)."""
    from config import otel

    otel.setup_from_settings("worker")


@worker_ready.connect
def _start_tracing_in_threads(sender: Any = None, **kwargs: Any) -> None:
    """A pool of threads (the `webhooks` process) runs its tasks in the main process,
    which no ``worker_process_init`` reaches: tracing is set up there, once ready."""
    from celery.concurrency.thread import TaskPool as ThreadPool

    if isinstance(getattr(sender, "pool", None), ThreadPool):
        from config import otel

        otel.setup_from_settings("worker")


@worker_process_shutdown.connect
@worker_shutdown.connect
def _flush_tracing(**kwargs: Any) -> None:
    from config import otel

    otel.flush()
