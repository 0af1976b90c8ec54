"""The Celery transport of run messages: how ``runs.outbox`` messages reach the workers.

``OrchestratorConfig.ready`` registers ``CeleryTransport`` with ``runs.outbox``; the run
lifecycle collects its messages there and this publishes them after commit, by task
name (no import of the tasks). A publish that fails because the broker is unreachable
is logged and dropped, never raised: the state it announces is already committed in
PostgreSQL, and the lost-message sweep (``orchestrator.sweeps.redispatch_lost``) sends
it again. Raising would turn a committed request into an error for its caller.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence

from django.conf import settings
from kombu.exceptions import OperationalError as BrokerError
from redis.exceptions import RedisError

from config.celery import QUEUE_RUNS_HIGH, QUEUE_RUNS_NORMAL, QUEUE_STEPS, app
from runs.outbox import RunMessage, StepMessage

PICK_UP_TASK = "orchestrator.runs.pick_up"
RESUME_TASK = "orchestrator.runs.resume"
EXECUTE_STEP_TASK = "orchestrator.steps.execute"
RUN_TASKS = {RunMessage.PICK_UP: PICK_UP_TASK, RunMessage.RESUME: RESUME_TASK}

logger = logging.getLogger(__name__)
# What a publish raises when Redis is down or restarting.
BROKER_ERRORS = (BrokerError, RedisError, ConnectionError, OSError)


def run_queue(priority: int) -> str:
    return QUEUE_RUNS_HIGH if priority <= settings.ENGINE_HIGH_PRIORITY_MAX else QUEUE_RUNS_NORMAL


def _guarded(publish: Callable[[], None], what: str) -> None:
    try:
        publish()
    except BROKER_ERRORS as exc:
        logger.warning("%s not published (%s); the lost-message sweep will resend", what, exc)


class CeleryTransport:
    """``runs.outbox.Transport`` over Celery: run messages on the runs queues by
    priority, step messages on the steps queue with their time limits."""

    def publish_run(self, message: RunMessage, run_id: str, priority: int) -> None:
        name = RUN_TASKS[message]

        def publish() -> None:
            app.send_task(
                name,
                args=(run_id,),
                queue=run_queue(priority),
                priority=priority,
                ignore_result=True,
            )

        _guarded(publish, f"{name} of run {run_id}")

    def publish_steps(self, messages: Sequence[StepMessage]) -> None:
        def publish() -> None:
            with app.producer_or_acquire() as producer:
                for message in messages:
                    app.send_task(
                        EXECUTE_STEP_TASK,
                        args=(message.step_id,),
                        queue=QUEUE_STEPS,
                        priority=message.priority,
                        countdown=message.countdown_s or None,
                        soft_time_limit=max(1, math.ceil(message.timeout_s)),
                        time_limit=math.ceil(message.timeout_s) + settings.ENGINE_HARD_LIMIT_GRACE,
                        # send_task by name asks for a result unless told otherwise,
                        # whatever the task's own ignore_result says (PostgreSQL holds
                        # every outcome).
                        ignore_result=True,
                        producer=producer,
                    )

        _guarded(publish, "step messages")

    def revoke(self, task_ids: Sequence[str]) -> None:
        def publish() -> None:
            # Reaches the worker process running the task and terminates it.
            app.control.revoke(list(task_ids), terminate=True, signal="SIGTERM")

        _guarded(publish, f"revoke of {len(task_ids)} task(s)")
