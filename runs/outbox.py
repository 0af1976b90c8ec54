"""What the run lifecycle asks the transport to do once its transaction commits.

The services and the engine decide; they never talk to the broker. They put what must
be sent here (a step to execute, a run to pick up or resume, running steps to
terminate), and the transport that the orchestrator app registers at start-up
(``orchestrator.transport.CeleryTransport``, see ``OrchestratorConfig.ready``) publishes
it after commit, so a worker never sees work that might still roll back. This keeps the
layers one way: ``runs`` names no Celery task and imports nothing of ``orchestrator``.

A transport never raises for a broker outage: the state it announces is committed
already, and the lost-message sweep sends it again.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from runs.models import (
    NO_WORKER_OFFERS_TOOL,
    RunnerJob,
    RunnerJobStatus,
    Step,
    StepWait,
    StepWaitStatus,
)

__all__ = [
    "Outbox",
    "RunMessage",
    "StepMessage",
    "Transport",
    "asleep",
    "enqueue_run_message",
    "revoke_running_steps",
    "schedule_poll",
    "use_transport",
    "wake_runners",
]


class RunMessage(enum.StrEnum):
    """The run-level messages a worker acts on."""

    PICK_UP = "pick_up"  # PENDING (or RETRYING) -> RUNNING: materialise and dispatch
    RESUME = "resume"  # RESUMING -> RUNNING: send again what the pause held
    CHILD_ENDED = "child_ended"  # a child run ended: its parent takes note (runs.waits.children)
    ESCALATED = "escalated"  # a ticket was opened: on-call is told (runs.people.escalations)
    REPLAN = "replan"  # a re-plan was asked for: the planner is consulted (runs.people.replanning)
    ADMIT = "admit"  # a run ended: its organization's waiting runs looked at (run_admission)


def asleep(countdown_s: float) -> bool:
    """Whether a step due in ``countdown_s`` seconds is beyond the step-message horizon
    (RATE_LIMIT_MAX_COUNTDOWN_S): it gets no message now. Whoever parks a step that far
    marks its row ``asleep`` with its ``next_run_at`` (the same write), and the wake sweep
    sends its message once it comes within the horizon (``runs.engine.dispatch``); the
    outbox drops such a message. A countdown message held by a worker for longer than the
    broker's visibility timeout would be delivered again, and a timer of a year would
    otherwise be a chain of messages for a year."""
    return countdown_s > settings.RATE_LIMIT_MAX_COUNTDOWN_S


@dataclass(frozen=True)
class StepMessage:
    """A step ready to execute (the transport decides how it reaches a worker: its own
    message, or a doorbell of its run; either carries ids only)."""

    step_id: int
    run_id: str
    priority: int
    timeout_s: float
    countdown_s: float = 0.0


class Transport(Protocol):
    def publish_steps(self, messages: Sequence[StepMessage]) -> None: ...

    def publish_run(self, message: RunMessage, run_id: str, priority: int) -> None: ...

    def revoke(self, task_ids: Sequence[str], runs: Mapping[str, int]) -> None: ...

    def wake_runners(self, organization_id: str | None, runner_ids: Sequence[str]) -> None: ...

    def schedule_poll(self, wait_id: str, number: int, countdown_s: float) -> None: ...


_transport: Transport | None = None


def use_transport(transport: Transport) -> None:
    """Register how messages leave this process (the orchestrator app does, at start-up)."""
    global _transport
    _transport = transport


def _current() -> Transport:
    if _transport is None:
        raise ImproperlyConfigured(
            "no transport registered for run messages: is 'orchestrator' in INSTALLED_APPS?"
        )
    return _transport


def after_commit(action: Callable[[], None]) -> None:
    """Run ``action`` once the transaction commits (never if it rolls back)."""

    def guarded() -> None:
        if settings.ORCHESTRATOR_DISPATCH_ENABLED:
            action()

    transaction.on_commit(guarded)


def enqueue_run_message(message: RunMessage, run_id: object, priority: int) -> None:
    """Publish a run-level message on its priority's queue once the transaction commits."""
    after_commit(lambda: _current().publish_run(message, str(run_id), priority))


@dataclass
class Outbox:
    """Step messages collected during one transaction, published together after it
    commits (one connection for a fan-out of thousands)."""

    messages: list[StepMessage] = field(default_factory=list)
    _registered: bool = False

    def add(self, message: StepMessage) -> None:
        if message.countdown_s and asleep(message.countdown_s):
            return  # its row is marked asleep: the wake sweep sends it (``asleep``)
        self.messages.append(message)
        if not self._registered:
            self._registered = True
            after_commit(self.publish)

    def publish(self) -> None:
        messages, self.messages, self._registered = self.messages, [], False
        if messages:
            _current().publish_steps(messages)


def wake_runners(organization_id: str | None, runner_ids: Sequence[str]) -> None:
    """Wake the held polls of ``runner_ids`` (a stop for them) and, with an organization,
    of all its runners (a job for whichever matches). Call it after commit."""
    _current().wake_runners(organization_id, runner_ids)


def schedule_poll(wait_id: str, number: int, countdown_s: float) -> None:
    """Send poll ``number`` of a poll wait in ``countdown_s`` (call it after commit)."""
    _current().schedule_poll(wait_id, number, countdown_s)


def revoke_running_steps(steps: Any) -> None:
    """Terminate, after commit, the work executing the RUNNING steps in ``steps``.

    Call it before the steps leave RUNNING. A tool that checks ``stop_requested`` stops
    even sooner; a revoke lost with the broker leaves the tool running to its end, and
    its result is dropped (its step is no longer RUNNING). The transport is told the
    runs (and their priorities) too: the worker task terminated may be serving its run's
    other steps as well (a doorbell), and the transport replaces it.

    A step parked on a runner job (``runs.engine.waiting``) has no worker task: its job
    is stopped instead, in this transaction. A job no runner claimed yet simply ends; a
    claimed or running one goes STOPPING and its runner's poll is woken to hand it the
    stop command (it reports ``stopped`` once its process is gone; that report is then
    dropped, the step having left RUNNING).
    """
    running = steps.filter(status="running")
    rows = running.values_list("celery_task_id", "run_id", "run__priority")
    task_ids = sorted({task_id for task_id, _, _ in rows if task_id})
    runs = {str(run_id): priority for task_id, run_id, priority in rows if task_id}
    if task_ids:
        after_commit(lambda: _current().revoke(task_ids, runs))
    _stop_runner_jobs(running)
    _close_waits(running)


def _close_waits(running_steps: Any) -> None:
    # Only callback and poll steps have waits; a post to a closed callback is refused.
    StepWait.objects.filter(
        step__in=running_steps.filter(tool__in=("callback", "poll")).values("pk"),
        status=StepWaitStatus.WAITING,
    ).update(status=StepWaitStatus.CLOSED, ended_at=timezone.now())


def _stop_runner_jobs(running_steps: Any) -> None:
    # Only `runner` steps and those of worker tools (a dotted name: docs/tools.md) have
    # jobs: most calls cost this one query and find none. The rows are locked as read, so
    # a poll (SKIP LOCKED) cannot claim one in between.
    live = (RunnerJobStatus.PENDING, RunnerJobStatus.CLAIMED, RunnerJobStatus.RUNNING)
    with_jobs = running_steps.filter(Q(tool="runner") | Q(tool__contains="."))
    found = list(
        RunnerJob.objects.select_for_update()
        .filter(step__in=with_jobs.values("pk"), status__in=live)
        .values_list("pk", "status", "runner_id", "step_id")
    )
    if not found:
        return
    now = timezone.now()
    pending = [pk for pk, status, _, _ in found if status == RunnerJobStatus.PENDING]
    held = [pk for pk, status, _, _ in found if status != RunnerJobStatus.PENDING]
    RunnerJob.objects.filter(pk__in=pending).update(
        status=RunnerJobStatus.STOPPED, stop_requested_at=now, completed_at=now
    )
    unclaimed = [step for _, status, _, step in found if status == RunnerJobStatus.PENDING]
    if unclaimed:
        # A reason left on a step would read as a rate limit's park at its next claim.
        Step.objects.filter(pk__in=unclaimed, waiting_reason=NO_WORKER_OFFERS_TOOL).update(
            waiting_reason=""
        )
    RunnerJob.objects.filter(pk__in=held).update(
        status=RunnerJobStatus.STOPPING, stop_requested_at=now
    )
    runner_ids = sorted(
        {
            str(runner)
            for _, status, runner, _ in found
            if runner and status != RunnerJobStatus.PENDING
        }
    )
    if runner_ids:
        after_commit(lambda: wake_runners(None, runner_ids))
