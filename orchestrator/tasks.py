"""Celery tasks of the engine. Thin: they take ids and call the engine (``runs.engine``) or a
service.

Every task is safe to receive twice: a run is picked up only while PENDING, a step is
claimed only while pending (a conditional UPDATE), sweeps re-check each row under lock.
Transient infrastructure errors (database, broker) are retried by Celery with backoff
and jitter (``common.task_base``); a step's own retry policy is the engine's, persisted
in PostgreSQL.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

from celery import Task, shared_task
from django.conf import settings

from artifacts import services as artifact_services
from common import metrics
from common.task_base import RETRY_OPTIONS, TRANSIENT, EngineTask
from orchestrator import executor, notify, polling, retention, sweeps, webhooks
from orchestrator.transport import CeleryTransport, serving
from runs.admission import run_admission, step_admission
from runs.engine import control, dispatch
from runs.engine.outcomes import Outcome, record
from runs.models import Run
from runs.people import planners, replanning
from runs.waits import callbacks, children, runners
from schedules import services as schedule_services

logger = logging.getLogger(__name__)
T = TypeVar("T")


def _swept(sweep: str, counts: dict[str, int]) -> dict[str, int]:
    """A sweep's result, counted for Prometheus (common.metrics) and returned."""
    metrics.sweep_actions(sweep, counts)
    return counts


@shared_task(name="orchestrator.diagnostics.echo", ignore_result=False)
def echo_task(payload: Any) -> dict[str, Any]:
    """Return what was sent, with the worker that answered: a broker round-trip probe."""
    return {"payload": payload, "hostname": echo_task.request.hostname}


@shared_task(bind=True, name="orchestrator.runs.pick_up", **RETRY_OPTIONS)
def pick_up_run_task(self: Task[Any, Any], run_id: str, priority: int | None = None) -> bool:
    """Pick the run up, then serve its first ready steps here, as a doorbell of the run
    would (one doorbell fewer is rung for it): the first step starts without another
    broker hop. ``priority`` is None in a message from before it was sent."""
    worker = f"worker:{self.request.hostname}"
    if not settings.ENGINE_DOORBELLS:
        return control.pick_up(run_id, actor=worker)
    with serving(run_id):
        picked = control.pick_up(run_id, actor=worker)
    if picked:
        if priority is None:
            priority = Run.objects.values_list("priority", flat=True).get(pk=run_id)
        _serve_after_pick_up(run_id, priority, worker=worker, task_id=self.request.id or "")
    return picked


def _serve_after_pick_up(run_id: str, priority: int, *, worker: str, task_id: str) -> None:
    """``executor.serve`` for the doorbell the pick-up stood for. The pick-up is committed
    and must not run again, so what a doorbell would retry is handed to one: a recording
    that failed goes to a doorbell that replays it, a claim that failed rings again."""
    try:
        executor.serve(
            run_id, priority, worker=worker, task_id=task_id, hard_limits=executor.in_pool_process()
        )
    except executor.RecordFailed as exc:
        logger.warning("run %s: a recording failed after its pick-up (%s); replaying", run_id, exc)
        CeleryTransport().ring_to_replay(run_id, priority, exc.replay)
    except TRANSIENT as exc:
        logger.warning("run %s: serving after its pick-up failed (%s); ringing", run_id, exc)
        CeleryTransport().ring({run_id: priority}, "retry")


def _step_work(task: Task[Any, Any], work: Callable[[], T]) -> T:
    """Run a step task's ``work``: a transient error retries the task with backoff; a
    recording that failed after the tool ran retries the recording alone (``replay``),
    never the tool."""
    try:
        return work()
    except executor.RecordFailed as exc:
        raise task.retry(
            exc=exc, kwargs={"replay": exc.replay}, countdown=2**task.request.retries
        ) from exc
    except TRANSIENT as exc:
        raise task.retry(exc=exc, countdown=2**task.request.retries) from exc


def _record_replay(replay: dict[str, Any]) -> None:
    outcome = Outcome.from_dict(replay["outcome"])
    record(replay["step_id"], replay["run_id"], replay["attempt"], outcome)


@shared_task(bind=True, base=EngineTask, name="orchestrator.steps.execute", max_retries=8)
def execute_step_task(
    self: Task[Any, Any], step_id: int, replay: dict[str, Any] | None = None
) -> str:
    """Execute one step (a step due later: a retry after its backoff)."""

    def work() -> str:
        if replay is not None:
            _record_replay({"step_id": step_id, **replay})
            return "recorded"
        return executor.execute_step(
            step_id, worker=f"worker:{self.request.hostname}", task_id=self.request.id or ""
        )

    return _step_work(self, work)


@shared_task(bind=True, base=EngineTask, name="orchestrator.steps.doorbell", max_retries=8)
def doorbell_task(
    self: Task[Any, Any], run_id: str, priority: int, replay: dict[str, Any] | None = None
) -> int:
    """Serve the claimable steps of a run (``executor.serve``); return how many."""

    def work() -> int:
        if replay is not None:
            _record_replay(replay)
        return executor.serve(
            run_id,
            priority,
            worker=f"worker:{self.request.hostname}",
            task_id=self.request.id or "",
            hard_limits=executor.in_pool_process(),
        )

    return _step_work(self, work)


@shared_task(name="orchestrator.sweeps.leases", **RETRY_OPTIONS)
def sweep_leases_task() -> dict[str, int]:
    return _swept("leases", sweeps.reclaim_expired_leases())


@shared_task(name="orchestrator.runs.resume", **RETRY_OPTIONS)
def resume_run_task(run_id: str) -> bool:
    return control.resume(run_id, actor=f"worker:{resume_run_task.request.hostname}")


@shared_task(name="orchestrator.sweeps.timeouts", **RETRY_OPTIONS)
def sweep_timeouts_task() -> dict[str, int]:
    return _swept("timeouts", sweeps.sweep_timeouts())


@shared_task(name="orchestrator.sweeps.runners", **RETRY_OPTIONS)
def sweep_runners_task() -> dict[str, int]:
    return _swept("runners", runners.sweep())


@shared_task(name="orchestrator.sweeps.lost_messages", **RETRY_OPTIONS)
def sweep_lost_messages_task() -> dict[str, int]:
    return _swept("lost_messages", sweeps.redispatch_lost())


@shared_task(name="orchestrator.runs.child_ended", **RETRY_OPTIONS)
def child_ended_task(run_id: str) -> bool:
    return children.child_ended(run_id)


@shared_task(name="orchestrator.steps.poll", **RETRY_OPTIONS)
def poll_task(wait_id: str, number: int) -> bool:
    return polling.poll_once(wait_id, number)


@shared_task(name="orchestrator.sweeps.wake", **RETRY_OPTIONS)
def sweep_asleep_task() -> dict[str, int]:
    """The wake sweep: messages for the steps parked beyond the step-message horizon
    whose time comes within it (docs/engine.md, "Timers")."""
    return _swept("wake", {"sent": dispatch.wake_asleep()})


@shared_task(name="orchestrator.steps.wake", **RETRY_OPTIONS)
def wake_step_task(step_id: int, *_: Any) -> str:
    """A wake-up of the chain an earlier version sent for a step due later than the
    step-message horizon: the step's message again, or asleep for the wake sweep
    (``dispatch.rearm``). Nothing sends one any more; the task stays so that those still
    queued across an upgrade (a rolling one: old workers send them to new ones) wake
    their steps instead of failing as unregistered."""
    return "gone" if dispatch.rearm(step_id) is None else "rearmed"


@shared_task(name="orchestrator.sweeps.waits", **RETRY_OPTIONS)
def sweep_waits_task() -> dict[str, int]:
    return _swept("waits", callbacks.sweep())


@shared_task(name="orchestrator.sweeps.artifacts", **RETRY_OPTIONS)
def sweep_artifacts_task() -> dict[str, int]:
    return _swept("artifacts", artifact_services.sweep())


@shared_task(name="orchestrator.sweeps.schedules", **RETRY_OPTIONS)
def fire_due_schedules_task() -> dict[str, int]:
    """Beat's schedule tick: fire the run schedules that are due (docs/schedules.md)."""
    return _swept("schedules", schedule_services.schedules_fire_due())


@shared_task(name="orchestrator.sweeps.rate_grants", **RETRY_OPTIONS)
def sweep_rate_grants_task() -> dict[str, int]:
    """Grants older than the longest period no window counts any more."""
    return _swept("rate_grants", {"pruned": step_admission.prune_grants()})


@shared_task(name="orchestrator.sweeps.retention", **RETRY_OPTIONS)
def sweep_retention_task() -> dict[str, int]:
    """Webhook deliveries and attempts, schedule fires older than RETENTION_DAYS."""
    return _swept("retention", retention.prune())


# The webhooks process's tasks are acknowledged when received, not when done: a
# delivery's claim in PostgreSQL (its lease) is what gets it sent again when its sender
# dies, never its message. Acknowledged late, a send in flight when the broker
# connection was lost was cancelled (CELERY_WORKER_CANCEL_LONG_RUNNING_TASKS_ON_
# CONNECTION_LOSS), which the process's pool of threads cannot do: the whole process
# stopped ("does not implement kill_job"; make chaos's Redis restart found it).
WEBHOOK_TASK_OPTIONS = {**RETRY_OPTIONS, "acks_late": False}


@shared_task(name="orchestrator.webhooks.sweep", **WEBHOOK_TASK_OPTIONS)
def sweep_webhooks_task() -> dict[str, int]:
    """Claim the run webhooks' due deliveries and send each (docs/webhooks.md)."""
    return _swept("webhooks", webhooks.sweep())


@shared_task(name="orchestrator.webhooks.deliver", **WEBHOOK_TASK_OPTIONS)
def webhook_delivery_task(delivery_id: int, token: str) -> str | None:
    """Send one claimed delivery; a duplicate message, or one whose claim passed to
    another, sends nothing."""
    return webhooks.deliver(delivery_id, token)


@shared_task(bind=True, name="orchestrator.runs.escalated", **RETRY_OPTIONS)
def notify_escalated_task(self: Task[Any, Any], run_id: str) -> bool:
    """Tell on-call of the run's new escalation (webhook, e-mail); a channel that failed
    is tried again with backoff until ESCALATION_WEBHOOK_ATTEMPTS attempts were made."""
    again = notify.notify_run(run_id)
    if again is not None:
        # Each channel counts its own attempts (in PostgreSQL): this bound is a backstop.
        raise self.retry(countdown=again, max_retries=2 * settings.ESCALATION_WEBHOOK_ATTEMPTS + 8)
    return True


@shared_task(name="orchestrator.runs.replan", **RETRY_OPTIONS)
def replan_run_task(run_id: str) -> str:
    """Ask the run's planner for new agents and spawn them (``runs.people.replanning``)."""
    return replanning.replan_run(run_id, planners.planner_named)


@shared_task(name="orchestrator.runs.admit", **RETRY_OPTIONS)
def admit_waiting_task(run_id: str) -> int:
    """A run ended: start the runs of its organization that waited for a place."""
    organization = Run.objects.values_list("organization_id", flat=True).filter(pk=run_id).first()
    return len(run_admission.admit_waiting(organization)) if organization else 0
