"""Publishing engine messages after commit, by task name (no import of the tasks).

Every message is published only once the transaction that made it necessary commits
(``transaction.on_commit``), so a worker never sees work that might still roll back.
A publish that fails because the broker is unreachable is logged and dropped, never
raised: the state it announces is already committed in PostgreSQL, and the lost-message
sweep (``orchestrator.sweeps.redispatch_lost``) sends it again. Raising would turn a
committed request into an error for its caller.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import transaction
from kombu.exceptions import OperationalError as BrokerError
from redis.exceptions import RedisError

from config.celery import QUEUE_RUNS_HIGH, QUEUE_RUNS_NORMAL, QUEUE_STEPS, app

PICK_UP_TASK = "orchestrator.runs.pick_up"
RESUME_TASK = "orchestrator.runs.resume"
EXECUTE_STEP_TASK = "orchestrator.steps.execute"


logger = logging.getLogger(__name__)
# What a publish raises when Redis is down or restarting.
BROKER_ERRORS = (BrokerError, RedisError, ConnectionError, OSError)


def after_commit(publish: Callable[[], None], what: str) -> None:
    """Run ``publish`` once the transaction commits; a broker outage only logs."""

    def guarded() -> None:
        if not settings.ORCHESTRATOR_DISPATCH_ENABLED:
            return
        try:
            publish()
        except BROKER_ERRORS as exc:
            logger.warning("%s not published (%s); the lost-message sweep will resend", what, exc)

    transaction.on_commit(guarded)


def run_queue(priority: int) -> str:
    return QUEUE_RUNS_HIGH if priority <= settings.ENGINE_HIGH_PRIORITY_MAX else QUEUE_RUNS_NORMAL


def enqueue_run_task(name: str, run_id: object, priority: int) -> None:
    """Publish a run-level task on its priority's queue once the transaction commits."""

    def publish() -> None:
        app.send_task(
            name,
            args=(str(run_id),),
            queue=run_queue(priority),
            priority=priority,
            ignore_result=True,
        )

    after_commit(publish, f"{name} of run {run_id}")


@dataclass(frozen=True)
class StepMessage:
    step_id: int
    priority: int
    timeout_s: float
    countdown_s: float = 0.0


@dataclass
class Outbox:
    """Step messages collected during one transaction, published after it commits."""

    messages: list[StepMessage] = field(default_factory=list)
    _registered: bool = False

    def add(self, message: StepMessage) -> None:
        self.messages.append(message)
        if not self._registered:
            self._registered = True
            after_commit(self.publish, "step messages")

    def publish(self) -> None:
        messages, self.messages, self._registered = self.messages, [], False
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
                    # send_task by name asks for a result unless told otherwise, whatever
                    # the task's own ignore_result says (PostgreSQL holds every outcome).
                    ignore_result=True,
                    producer=producer,
                )


def revoke_running_steps(steps: Any) -> None:
    """Terminate, after commit, the Celery tasks executing the RUNNING steps in ``steps``.

    Call it before the steps leave RUNNING. Revoke reaches the worker process running the
    task and terminates it; a tool that checks ``stop_requested`` stops even sooner.
    """
    task_ids = [
        task_id
        for task_id in steps.filter(status="running").values_list("celery_task_id", flat=True)
        if task_id
    ]
    if not task_ids:
        return

    def revoke() -> None:
        app.control.revoke(task_ids, terminate=True, signal="SIGTERM")

    # Lost with the broker, a revoke leaves the tool running to its end: its step is no
    # longer RUNNING, so it stops at its next cooperative check and its result is dropped.
    after_commit(revoke, f"revoke of {len(task_ids)} task(s)")
