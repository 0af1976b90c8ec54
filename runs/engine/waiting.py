"""Steps that wait outside the worker: the attempt goes on RUNNING, with no worker, no
lease and no Celery task, until something outside reports its end.

A tool that hands its work to the outside returns a wait (``ToolResult.wait``); the
recording parks the step instead of completing it, in the run's transaction, and creates
what it waits on. Today that is a runner job (``runs.runners``; docs/runners.md): the
step ends when the job's runner reports, through ``outcomes.record`` like any attempt,
so retries, failure modes and the charge are the engine's as for any step. Nothing
sweeps a parked step's lease (it has none); its timeout, a cancel or a pause reach it as
they reach every running step, and stop its job (``outbox.revoke_running_steps``).
"""

from __future__ import annotations

import secrets
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings

from runs.models import EventKind, Run, RunnerJob, RunnerJobStatus, Step
from runs.outbox import after_commit, wake_runners
from runs.transitions import record_event

RUNNER_WAIT = "runner_job"


class WaitRefused(Exception):
    """The wait cannot start (a session no runner holds): the attempt fails with
    ``code``, as a tool error would."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def new_session_id() -> str:
    return f"ses_{secrets.token_hex(6)}"


def park(run: Run, step: Step, wait: dict[str, Any], now: datetime) -> RunnerJob:
    """Park ``step``'s current attempt on ``wait`` (the run and the step are locked)."""
    if wait.get("kind") != RUNNER_WAIT:
        raise ValueError(f"unknown wait {wait.get('kind')!r}")
    job = _runner_job(run, step, wait, now)
    Step.objects.filter(pk=step.pk).update(lease_expires_at=None, celery_task_id="", worker="")
    record_event(
        run,
        EventKind.RUNNER,
        message=f"waiting for a runner: job {job.pk}",
        payload={"job": str(job.pk), "demands": job.demands, "session_id": job.session_id},
        entity="step",
        entity_id=str(step.pk),
    )
    organization = str(run.organization_id)
    runners = [job.required_runner_id] if job.required_runner_id else []
    after_commit(lambda: wake_runners(organization, runners))
    return job


def _runner_job(run: Run, step: Step, wait: dict[str, Any], now: datetime) -> RunnerJob:
    session_id = wait.get("session_id") or ""
    required_runner = None
    if wait.get("type") == "resume_session":
        holder = (
            RunnerJob.objects.filter(
                organization_id=run.organization_id,
                session_id=session_id,
                runner__isnull=False,
            )
            .order_by("-created_at")
            .values_list("runner_id", flat=True)
            .first()
        )
        if holder is None:
            raise WaitRefused(
                "no_matching_runner", f"no runner holds session {session_id!r} to resume it"
            )
        required_runner = holder
    match_timeout = wait.get("match_timeout") or settings.RUNNER_MATCH_TIMEOUT
    return RunnerJob.objects.create(
        organization_id=run.organization_id,
        run=run,
        step=step,
        attempt=step.attempts,
        priority=run.priority,
        type=wait.get("type") or "start_session",
        prompt=wait["prompt"],
        session_id=session_id or new_session_id(),
        agent_name=wait.get("agent_name") or "",
        project_dir=wait.get("project_dir") or "",
        demands=wait.get("demands") or {},
        required_runner_id=required_runner,
        status=RunnerJobStatus.PENDING,
        timeout_at=now + timedelta(seconds=float(match_timeout)),
    )
