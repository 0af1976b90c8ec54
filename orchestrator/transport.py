"""The Celery transport of run messages: how ``runs.outbox`` messages reach the workers.

``OrchestratorConfig.ready`` registers ``CeleryTransport`` with ``runs.outbox``; the run
lifecycle collects its messages there and this publishes them after commit, by task
name (no import of the tasks). A publish that fails because the broker is unreachable
is logged and dropped, never raised: the state it announces is already committed in
PostgreSQL, and the lost-message sweep (``orchestrator.sweeps.redispatch_lost``) sends
it again. Raising would turn a committed request into an error for its caller.

Steps ready now travel as doorbells: PostgreSQL is the queue (a dispatched, pending step
is a claimable row) and a doorbell is a message naming a run only. The worker that
receives one claims the run's next claimable step, runs it, records it, and claims the
next, until the run has none left or its burst budget is spent
(``orchestrator.executor.serve``). So a fan-out of 2,000 steps costs a handful of
messages instead of 2,000, and a sequence is served by one worker without a broker hop
per step. How many doorbells a run needs: one per step that became ready, at most
``ENGINE_DOORBELLS``, one fewer for a run whose worker goes on serving it (``serving``).
A step due later (a retry's backoff) keeps a message of its own, with a countdown of at
most RATE_LIMIT_MAX_COUNTDOWN_S (the step-message horizon): a step due later than that has
no message at all until the wake sweep sends it (``runs.outbox.asleep``). A message held
with a countdown is one a worker holds unacknowledged, which Redis delivers again every
visibility timeout: days of it would pile up copies.
"""

from __future__ import annotations

import functools
import logging
import math
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import redis
from django.conf import settings
from kombu.exceptions import OperationalError as BrokerError
from redis.exceptions import RedisError

from common import metrics
from common.stores import broker_redis
from config.celery import QUEUE_RUNS_HIGH, QUEUE_RUNS_NORMAL, QUEUE_STEPS, app, queue_keys
from runs.outbox import RunMessage, StepMessage
from runs.waits.runners import organization_channel, runner_channel

PICK_UP_TASK = "orchestrator.runs.pick_up"
RESUME_TASK = "orchestrator.runs.resume"
EXECUTE_STEP_TASK = "orchestrator.steps.execute"
DOORBELL_TASK = "orchestrator.steps.doorbell"
CHILD_ENDED_TASK = "orchestrator.runs.child_ended"
POLL_TASK = "orchestrator.steps.poll"
ESCALATED_TASK = "orchestrator.runs.escalated"
REPLAN_TASK = "orchestrator.runs.replan"
ADMIT_TASK = "orchestrator.runs.admit"
RUN_TASKS = {
    RunMessage.PICK_UP: PICK_UP_TASK,
    RunMessage.RESUME: RESUME_TASK,
    RunMessage.CHILD_ENDED: CHILD_ENDED_TASK,
    RunMessage.ESCALATED: ESCALATED_TASK,
    RunMessage.REPLAN: REPLAN_TASK,
    RunMessage.ADMIT: ADMIT_TASK,
}

logger = logging.getLogger(__name__)
# What a publish raises when Redis is down or restarting.
BROKER_ERRORS = (BrokerError, RedisError, ConnectionError, OSError)


# How long a run whose recordings queued for their locks gets no more servers.
CROWDED_FOR_S = 2.0


def _crowded_key(run_id: str) -> str:
    return f"orchestrator:crowded:{run_id}"


def run_queue(priority: int) -> str:
    return QUEUE_RUNS_HIGH if priority <= settings.ENGINE_HIGH_PRIORITY_MAX else QUEUE_RUNS_NORMAL


_local = threading.local()


@contextmanager
def serving(run_id: str) -> Iterator[None]:
    """While a doorbell records a step of ``run_id`` inside this block, what the
    recording makes ready needs one doorbell fewer: the worker goes on claiming the
    run's next step itself when the block ends."""
    _local.serving = run_id
    try:
        yield
    finally:
        _local.serving = None


def _served_here(run_id: str) -> bool:
    """True once, for the run a doorbell goes on serving (one publish per recording)."""
    if getattr(_local, "serving", None) == run_id:
        _local.serving = None
        return True
    return False


def doorbell_limits() -> tuple[int, int]:
    """Celery's soft and hard time limits of a doorbell: a backstop only. Each step it
    serves has its own limits (``orchestrator.executor``); a doorbell runs at most a
    burst and then the longest step a plan may ask for, started at the burst's end.
    ``config/settings/checks.py`` keeps the broker's visibility timeout above the hard
    one."""
    longest = settings.ORCHESTRATOR_PLAN_LIMITS["max_step_timeout_ms"] / 1000
    soft = math.ceil(settings.ENGINE_BURST_SECONDS + longest) + settings.ENGINE_HARD_LIMIT_GRACE
    return soft, soft + settings.ENGINE_HARD_LIMIT_GRACE


def pick_up_limits() -> tuple[int, int]:
    """Celery's soft and hard time limits of a pick-up: a task's default for picking the
    run up, then a doorbell's, since the pick-up goes on to serve the run's first steps
    (``orchestrator.tasks.pick_up_run_task``)."""
    soft, hard = doorbell_limits()
    return (
        settings.CELERY_TASK_SOFT_TIME_LIMIT + soft,
        settings.CELERY_TASK_TIME_LIMIT + hard,
    )


@functools.lru_cache(maxsize=2)
def _redis(url: str) -> redis.Redis[bytes]:
    return broker_redis(url=url, socket_timeout=2, socket_connect_timeout=2)


def _guarded(publish: Callable[[], None], what: str) -> None:
    try:
        publish()
    except BROKER_ERRORS as exc:
        logger.warning("%s not published (%s); the lost-message sweep will resend", what, exc)
    except Exception:
        # A pooled producer left broken by a broker restart (kombu's channel closed under
        # it by another greenlet: AttributeError, in make chaos). A publish after commit
        # is repaired by the lost-message sweep; it must never fail the request that
        # committed. The pools are emptied so that the next publish connects afresh.
        logger.exception("%s not published; the lost-message sweep will resend", what)
        pools: list[Any] = [app.amqp.producer_pool, app.pool]  # kombu Resources (untyped)
        for pool in pools:
            pool.force_close_all(close_pool=False)


class CeleryTransport:
    """``runs.outbox.Transport`` over Celery: run messages on the runs queues by
    priority; doorbells, and the messages of steps due later with their time limits, on
    the steps queue."""

    def publish_run(self, message: RunMessage, run_id: str, priority: int) -> None:
        name = RUN_TASKS[message]
        # The run's priority travels with its pick-up, which serves the run's first steps
        # and may have to ring for the rest.
        args = (run_id, priority) if message == RunMessage.PICK_UP else (run_id,)
        limits: dict[str, Any] = {}
        if message == RunMessage.PICK_UP and settings.ENGINE_DOORBELLS:
            soft, hard = pick_up_limits()
            limits = {"soft_time_limit": soft, "time_limit": hard}

        def publish() -> None:
            app.send_task(
                name,
                args=args,
                queue=run_queue(priority),
                priority=priority,
                ignore_result=True,
                **limits,
            )

        _guarded(publish, f"{name} of run {run_id}")

    def publish_steps(self, messages: Sequence[StepMessage]) -> None:
        # A step due later keeps its own message, with its countdown; the others are
        # served by doorbells of their runs.
        if settings.ENGINE_DOORBELLS == 0:
            each, due_now = list(messages), []
        else:
            each = [message for message in messages if message.countdown_s > 0]
            due_now = [message for message in messages if message.countdown_s <= 0]
        rings = self._doorbells(due_now)

        def publish() -> None:
            with app.producer_or_acquire() as producer:
                for message in each:
                    self._send_step(message, producer)
                for run_id, (count, priority) in rings.items():
                    for _ in range(count):
                        self._send_doorbell(run_id, priority, producer)
            if rings:
                metrics.doorbells_rung("ready", sum(count for count, _ in rings.values()))

        _guarded(publish, "step messages")

    def call_for_help(self, run_id: str, priority: int) -> bool:
        """One more doorbell for the run, if a worker is free to answer it at once (no
        doorbell waits on the steps queue: a worker reserves a message only while one of
        its slots is free, ``worker_prefetch_multiplier`` 1) and the run's recordings
        are not crowded (``crowded``). True if it rang.

        How one run spreads over the fleet (docs/engine.md): a server that claims a step
        and sees more claimable calls for help, so servers double each round until the
        fleet is busy, the run has nothing more ready, or its recordings queue for
        their locks.
        """
        try:
            client = _redis(settings.CELERY_BROKER_URL)
            with client.pipeline(transaction=False) as pipe:
                pipe.exists(_crowded_key(run_id))
                for key in queue_keys(QUEUE_STEPS):
                    pipe.llen(key)
                crowded, *waiting = pipe.execute()
        except BROKER_ERRORS as exc:
            logger.warning("steps queue not read (%s); no help called for run %s", exc, run_id)
            return False
        if crowded or sum(waiting):
            return False
        self.ring({run_id: priority}, "help")
        return True

    def crowded(self, run_id: str) -> None:
        """The run's recordings queue for their locks: no call for help is answered for
        a while (CROWDED_FOR_S). A mark in the broker's Redis, shared by every worker;
        lost with Redis, it costs a few servers too many for a moment."""

        def mark() -> None:
            _redis(settings.CELERY_BROKER_URL).set(
                _crowded_key(run_id), b"1", px=int(CROWDED_FOR_S * 1000)
            )

        _guarded(mark, f"crowded mark of run {run_id}")

    def ring(self, runs: Mapping[str, int], reason: str) -> None:
        """One doorbell for each run (id -> priority); ``reason`` counts it
        (``metrics.doorbells_rung``)."""

        def publish() -> None:
            with app.producer_or_acquire() as producer:
                for run_id, priority in runs.items():
                    self._send_doorbell(run_id, priority, producer)
            metrics.doorbells_rung(reason, len(runs))

        _guarded(publish, f"doorbells of {len(runs)} run(s)")

    @staticmethod
    def _doorbells(messages: Sequence[StepMessage]) -> dict[str, tuple[int, int]]:
        """Run id -> (doorbells to send, priority) for steps ready now."""
        counts = Counter(message.run_id for message in messages)
        priorities = {message.run_id: message.priority for message in messages}
        rings = {}
        for run_id, count in counts.items():
            wanted = min(count - _served_here(run_id), settings.ENGINE_DOORBELLS)
            if wanted > 0:
                rings[run_id] = (wanted, priorities[run_id])
        return rings

    @staticmethod
    def _send_doorbell(run_id: str, priority: int, producer: Any, **options: Any) -> None:
        soft, hard = doorbell_limits()
        app.send_task(
            DOORBELL_TASK,
            args=(run_id, priority),
            queue=QUEUE_STEPS,
            priority=priority,
            soft_time_limit=soft,
            time_limit=hard,
            ignore_result=True,
            producer=producer,
            **options,
        )

    def schedule_poll(self, wait_id: str, number: int, countdown_s: float) -> None:
        # A poll's interval may be a day; a message held longer than this would come back
        # at every visibility timeout. It comes early instead, and the reading, not due
        # yet, sends itself again for the rest (``polling.poll_once``).
        countdown_s = min(countdown_s, float(settings.RATE_LIMIT_MAX_COUNTDOWN_S))

        def publish() -> None:
            app.send_task(
                POLL_TASK,
                args=(wait_id, number),
                queue=QUEUE_STEPS,
                countdown=countdown_s or None,
                ignore_result=True,
            )

        # Lost with the broker: the wait sweep sends it again (WAIT_LOST_AFTER).
        _guarded(publish, f"poll {number} of wait {wait_id}")

    def wake_runners(self, organization_id: str | None, runner_ids: Sequence[str]) -> None:
        """Publish on the channels that held runner polls listen to
        (``api.runner_views``): the organization's (a new job) and each runner's (a
        stop). A lost wake-up costs latency only: a held poll looks again every few
        seconds whatever it hears."""
        channels = [runner_channel(runner_id) for runner_id in runner_ids]
        if organization_id is not None:
            channels.append(organization_channel(organization_id))

        def publish() -> None:
            client = _redis(settings.CELERY_BROKER_URL)
            with client.pipeline(transaction=False) as pipe:
                for channel in channels:
                    pipe.publish(channel, b"wake")
                pipe.execute()

        if channels:
            _guarded(publish, f"runner wake-up on {len(channels)} channel(s)")

    def ring_to_replay(self, run_id: str, priority: int, replay: dict[str, Any]) -> None:
        """A doorbell of the run that first records an attempt whose recording failed
        (``executor.RecordFailed.replay``), a second later, then serves on."""

        def publish() -> None:
            self._send_doorbell(run_id, priority, None, kwargs={"replay": replay}, countdown=1)
            metrics.doorbells_rung("replay")

        _guarded(publish, f"replay of a recording of run {run_id}")

    @staticmethod
    def _send_step(message: StepMessage, producer: Any) -> None:
        # Never beyond the step-message horizon: the outbox keeps none (runs.outbox.asleep).
        app.send_task(
            EXECUTE_STEP_TASK,
            args=(message.step_id,),
            queue=QUEUE_STEPS,
            priority=message.priority,
            countdown=message.countdown_s or None,
            soft_time_limit=max(1, math.ceil(message.timeout_s)),
            time_limit=math.ceil(message.timeout_s) + settings.ENGINE_HARD_LIMIT_GRACE,
            # send_task by name asks for a result unless told otherwise, whatever the
            # task's own ignore_result says (PostgreSQL holds every outcome).
            ignore_result=True,
            producer=producer,
        )

    def revoke(self, task_ids: Sequence[str], runs: Mapping[str, int]) -> None:
        def publish() -> None:
            # Reaches the worker process running the task and terminates it.
            app.control.revoke(list(task_ids), terminate=True, signal="SIGTERM")

        _guarded(publish, f"revoke of {len(task_ids)} task(s)")
        # A doorbell terminated with the step it was running would leave its run's other
        # claimable steps waiting for the lost-message sweep: ring for each run again (a
        # run that has ended, cancelled say, is not served: the doorbell claims nothing).
        if settings.ENGINE_DOORBELLS:
            self.ring(runs, "revoke")
