"""Steps that wait outside the worker: the attempt goes on RUNNING, with no worker, no
lease and no Celery task, until something outside ends it.

A tool that hands its work to the outside returns a wait (``ToolResult.wait``); the
recording parks the step instead of completing it, in the run's transaction, and creates
what it waits on (docs/runners.md):

- ``runner_job``: a job for an external runner (``runs.waits.runners``), ended by its report;
- ``child_run``: a child run (``runs.waits.children``); in sync mode the step waits for its
  end, in the async modes it completes at once with ``{child_run}`` (async_callback
  first adds its on_callback handlers, held until the child ends);
- ``callback``: the URL the tool opened (``runs.waits.callbacks``), ended by a post to it;
- ``poll``: a URL the engine reads by scheduled messages until a condition holds.

Whatever ends the wait records the attempt through ``outcomes.record`` like any attempt,
so retries, failure modes and the charge are the engine's as for any step. Nothing
sweeps a parked step's lease (it has none); a cancel or a pause reach it as they reach
every running step (``outbox.revoke_running_steps``), its timeout by the wait sweeps.
Parking is idempotent: a recording delivered twice finds the wait of its attempt.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction

from billing.services import InsufficientCredits
from common import tracing
from runs import catalogue, services
from runs.engine.start import run_start
from runs.materialize import add_handler_rows
from runs.models import (
    NO_WORKER_OFFERS_TOOL,
    EventKind,
    Run,
    RunnerJob,
    RunnerJobStatus,
    Step,
    StepWait,
    StepWaitKind,
    StepWaitStatus,
    Task,
)
from runs.outbox import after_commit, schedule_poll, wake_runners
from runs.plan import PlanInvalid
from runs.transitions import record_event

RUNNER_WAIT = "runner_job"
# A worker tool's job waits for a worker as long as its run does (its step's timeout
# counts from the claim): a horizon, not a limit anyone meets.
TOOL_JOB_MATCH_HORIZON = timedelta(days=366)


class WaitRefused(Exception):
    """The wait cannot start (a session no runner holds): the attempt fails with
    ``code``, as a tool error would."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def new_session_id() -> str:
    return f"ses_{secrets.token_hex(6)}"


def park(run: Run, step: Step, wait: dict[str, Any], now: datetime) -> dict[str, Any] | None:
    """Park ``step``'s current attempt on ``wait`` (the run and the step are locked).

    None: the step waits. A dict: the step completes now with it as its output (a child
    run started asynchronously)."""
    kind = wait.get("kind")
    # The attempt's span (current while it is recorded) waits with it: the parent of the
    # wait's span, of the runner job's and the link of a child run's trace.
    step.trace_context = tracing.traceparent() or step.trace_context
    if kind == "child_run":
        output = _start_child(run, step, wait, now)
        if output is not None:
            return output
    elif kind == RUNNER_WAIT:
        if not RunnerJob.objects.filter(step=step, attempt=step.attempts).exists():
            _park_on_job(run, step, wait, now)
    elif kind == "callback":
        _park_on_callback(run, step, wait)
    elif kind == "poll":
        _start_poll(run, step, wait, now)
    else:
        raise ValueError(f"unknown wait {kind!r}")
    # The worker forgotten, so is the claim it made (kept on the row): the update writes
    # it as its event row (runs.run_history).
    Step.objects.filter(pk=step.pk).update(
        lease_expires_at=None,
        celery_task_id="",
        worker="",
        trace_context=step.trace_context,
        claim_event=None,
        claimed_at=None,
    )
    return None


def _park_on_job(run: Run, step: Step, wait: dict[str, Any], now: datetime) -> None:
    job = _runner_job(run, step, wait, now)
    payload: dict[str, Any] = {"job": str(job.pk), "demands": job.demands}
    if job.tool:
        offered = catalogue.offering(run.organization_id, job.tool, now).filter(
            tools__contains={job.tool: job.tool_version}
        )
        if not offered.exists():
            # Shown where waits are (the step, the dashboard, `orch steps`); a worker
            # that comes online claims the job, which clears it (runs.waits.runners.poll).
            Step.objects.filter(pk=step.pk).update(waiting_reason=NO_WORKER_OFFERS_TOOL)
        what = f"a worker offering {job.tool} {job.tool_version}"
        payload |= {"tool": job.tool, "version": job.tool_version}
    else:
        what = "a runner"
        payload["session_id"] = job.session_id
    record_event(
        run,
        EventKind.RUNNER,
        message=f"waiting for {what}: job {job.pk}",
        payload=payload,
        entity="step",
        entity_id=str(step.pk),
    )
    organization = str(run.organization_id)
    runners = [job.required_runner_id] if job.required_runner_id else []
    after_commit(lambda: wake_runners(organization, runners))


@dataclass(frozen=True)
class Parked:
    """Parked steps' waits that may outlive the step's own timeout (a parked step has no
    worker to enforce it): ``rows`` (``FROM ... WHERE ...``, the step aliased ``s``), each
    overdue once the step's timeout has passed since its ``clock`` column."""

    id: str
    rows: str
    clock: str

    @property
    def _deadline(self) -> str:
        timeout = "make_interval(secs => COALESCE(s.timeout_ms, %(default_ms)s) / 1000.0)"
        return f"{self.clock} + {timeout}"

    def _query(self, sql: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        default_ms = int(float(settings.ENGINE_DEFAULT_STEP_TIMEOUT) * 1000)
        with connection.cursor() as cursor:
            cursor.execute(sql, {**params, "default_ms": default_ms})
            return list(cursor.fetchall())

    def overdue(self, now: datetime) -> list[Any]:
        """The ids of those past their deadline, the oldest first, at most 1,000."""
        sql = f"SELECT {self.id} {self.rows} AND {self._deadline} < %(now)s"
        rows = self._query(f"{sql} ORDER BY {self.clock} LIMIT 1000", {"now": now})
        return [row[0] for row in rows]

    def next_deadline(self) -> datetime | None:
        """The earliest deadline among them, or None."""
        sql = f"SELECT min({self._deadline}) {self.rows}"
        deadline: datetime | None = self._query(sql, {})[0][0]
        return deadline


# --------------------------------------------------------------------------- child runs
def _start_child(
    run: Run, step: Step, wait: dict[str, Any], now: datetime
) -> dict[str, Any] | None:
    """Create and start the child run of this attempt (once); its output if the step
    completes now, None if it waits for the child."""
    mode = wait["mode"]
    child = Run.objects.filter(parent_step=step, parent_step_attempt=step.attempts).first()
    if child is None:
        child = _create_child(run, step, wait)
        record_event(
            run,
            EventKind.CHILD,
            message=f"started child run {child.pk} ({mode})",
            payload={"child_run": str(child.pk), "mode": mode, "depth": child.depth},
            entity="step",
            entity_id=str(step.pk),
        )
        if mode == "async_callback":
            _hold_callback_handlers(run, step)
    if mode == "sync":
        return None
    return {"child_run": str(child.pk)}


def _create_child(run: Run, step: Step, wait: dict[str, Any]) -> Run:
    depth = run.depth + 1
    if depth > settings.RUN_MAX_DEPTH:
        raise WaitRefused(
            "run_depth_exceeded",
            f"a child run here would be at depth {depth}; RUN_MAX_DEPTH is "
            f"{settings.RUN_MAX_DEPTH} (the top run is at depth 0)",
        )
    plan = dict(wait["plan"])
    if wait.get("variables"):
        given = plan.get("variables")
        plan["variables"] = {**(given if isinstance(given, dict) else {}), **wait["variables"]}
    parent = services.ChildOf(
        run=run, step=step, attempt=step.attempts, mode=wait["mode"], depth=depth
    )
    try:
        # A savepoint: a child refused (its plan, its credits) leaves nothing behind.
        with transaction.atomic():
            child = services.run_create(
                organization=run.organization, plan=plan, actor=f"run {run.pk}", parent=parent
            )
            return run_start(run_id=child.pk, actor=f"run {run.pk}")
    except PlanInvalid as exc:
        raise WaitRefused("invalid_plan", f"the child run's plan is invalid: {exc}") from exc
    except InsufficientCredits as exc:
        raise WaitRefused("insufficient_credits", f"the child run cannot start: {exc}") from exc


def _hold_callback_handlers(run: Run, step: Step) -> None:
    """Add the step's on_callback handlers to its task, in sequence, the first held by
    one more dependency (the child's end): the task cannot finish before they ran."""
    task = Task.objects.get(pk=step.task_id)
    first_position = step.position * 1000 + 1_000_500  # after the planned steps and on_error
    add_handler_rows(run, task, step, "on_callback", first_position, held=1)


# --------------------------------------------------------------------------- callbacks
def _park_on_callback(run: Run, step: Step, wait: dict[str, Any]) -> None:
    """The callback was opened by the tool (its URL had to exist before the request
    that hands it out); the step now waits for a post to it."""
    record_event(
        run,
        EventKind.WAIT,
        message=f"waiting for callback {wait.get('wait')}",
        # The callback's id, never its URL: the URL's token ends the step, and events are
        # shown to keys that may not (read scope). The organization's full keys end it by
        # this id (``callbacks.receive_callback_of``).
        payload={"wait": wait.get("wait"), "request": _status_of(wait.get("request"))},
        entity="step",
        entity_id=str(step.pk),
    )


def _status_of(response: Any) -> Any:
    return response.get("status") if isinstance(response, dict) else None


# --------------------------------------------------------------------------- polls
POLL_KEYS = ("url", "headers", "query", "interval", "max_attempts", "done_when", "failed_when")


def _start_poll(run: Run, step: Step, wait: dict[str, Any], now: datetime) -> None:
    """Open the attempt's poll and send its first message (after commit)."""
    if StepWait.objects.filter(step=step, attempt=step.attempts).exists():
        return
    poll = StepWait.objects.create(
        run=run,
        step=step,
        attempt=step.attempts,
        kind=StepWaitKind.POLL,
        status=StepWaitStatus.WAITING,
        params={key: wait[key] for key in POLL_KEYS},
        next_poll_at=now,
        expires_at=now + timedelta(seconds=float(wait["timeout"])),
    )
    record_event(
        run,
        EventKind.WAIT,
        message=f"polling {wait['url']} every {wait['interval']:g}s",
        payload={"wait": str(poll.pk), "max_attempts": wait["max_attempts"]},
        entity="step",
        entity_id=str(step.pk),
    )
    wait_id = str(poll.pk)
    after_commit(lambda: schedule_poll(wait_id, 1, 0.0))


# --------------------------------------------------------------------------- runner jobs
def _runner_job(run: Run, step: Step, wait: dict[str, Any], now: datetime) -> RunnerJob:
    tool = wait.get("tool") or ""
    if tool:
        return _tool_job(run, step, tool, wait, now)
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
        trace_context=step.trace_context,
    )


def _tool_job(run: Run, step: Step, tool: str, wait: dict[str, Any], now: datetime) -> RunnerJob:
    """A worker tool's job (docs/tools.md): for its current version, which a worker must
    offer to claim it, with the step's rendered params."""
    current = catalogue.current_version(run.organization_id, tool)
    if current is None or current.placement != "worker":
        raise WaitRefused(
            "tool_error", f"no worker of this organization has published the tool {tool}"
        )
    return RunnerJob.objects.create(
        organization_id=run.organization_id,
        run=run,
        step=step,
        attempt=step.attempts,
        priority=run.priority,
        type="tool",
        prompt="",
        session_id="",
        demands=wait.get("demands") or {},
        status=RunnerJobStatus.PENDING,
        timeout_at=now + TOOL_JOB_MATCH_HORIZON,
        trace_context=step.trace_context,
        tool=tool,
        tool_version=current.version,
        params=wait.get("params") or {},
    )
