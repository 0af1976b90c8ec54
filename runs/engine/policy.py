"""The engine's policy layer (docs/escalation.md): when a failing run
is handed to people, and when it asks a planner for new agents.

Escalate: evaluated when a step attempt fails with an error that would be retried.

- ``backoff_exceeded``: the retry's backoff would exceed the policy's `max_delay_ms`
  (only a policy that wrote it; ``runs.engine.retry.decide`` says so);
- ``attempts_exhausted``: the budgets are spent and the policy says
  `on_exhausted: escalate` (``decide`` again);
- ``error_burst``: more than `max_errors` failed attempts of the run in the window;
- ``error_rate``: more than `max_error_rate` of the window's attempts failed, once the
  window holds `min_attempts`.

Non-retryable errors never escalate: they fail as the failure modes say. Escalating
leaves the failing step PENDING (it is not failed: a person decides), moves the run to
ESCALATED (nothing new is claimed; running steps finish and are recorded), opens one
ticket per run (a run already escalated adds its failures to it) and asks, after commit,
for on-call to be told.

Re-plan: evaluated when an agent or task fails for good and the run goes on: more than
`agent_failure_ratio` of the run's agents failed, or more than `task_failures` tasks.
Asking holds the run open (one extra open child) until the planner has answered
(``runs.people.replanning``), so the run cannot complete under the planner's feet.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import F, Q
from django.utils import timezone

from common.tools.base import ToolError
from runs.engine.tree import MAX_LEVEL_RETRIES
from runs.models import (
    Agent,
    EscalationReason,
    EscalationStatus,
    EscalationTicket,
    EventKind,
    FailureMode,
    Replan,
    ReplanTrigger,
    Run,
    Severity,
    Step,
    StepFailure,
    Task,
)
from runs.outbox import RunMessage, enqueue_run_message
from runs.states import NodeStatus, RunStatus, StepStatus
from runs.transitions import record_event, transition, transition_locked

# A ticket keeps at most this many failures (the first that triggered it, the latest).
TICKET_ERRORS = 50
# What a ticket shows of the window that triggered it.
TRIGGER_ERRORS = 20
SEVERITY: dict[str, str] = {
    EscalationReason.ERROR_BURST: Severity.HIGH,
    EscalationReason.ERROR_RATE: Severity.HIGH,
    EscalationReason.ATTEMPTS_EXHAUSTED: Severity.HIGH,
    EscalationReason.BACKOFF_EXCEEDED: Severity.MEDIUM,
    EscalationReason.OPERATOR: Severity.MEDIUM,
}
# Why an agent or task ended without completing that is not a failure of its own.
NOT_FAILURES = ("dependency_failed", "replanned")
OPEN_TICKET = (EscalationStatus.OPEN, EscalationStatus.ACKNOWLEDGED)
# The run states in which a failure may escalate (a paused run's ticket opens at once;
# the run itself escalates at its resume).
ESCALATES = (RunStatus.RUNNING, RunStatus.ESCALATED, RunStatus.PAUSED, RunStatus.RESUMING)


# --------------------------------------------------------------------------- thresholds
@dataclass(frozen=True)
class EscalationLimits:
    enabled: bool
    window: timedelta
    max_errors: int
    max_error_rate: float
    min_attempts: int


@dataclass(frozen=True)
class ReplanLimits:
    enabled: bool
    agent_failure_ratio: float
    task_failures: int
    max_replans: int
    planner: str


def escalation_limits(run: Run) -> EscalationLimits:
    """The run's escalation thresholds: its plan's, settings for what it left out."""
    given = (run.policy or {}).get("escalation", {})
    window_ms = given.get("window_ms")
    return EscalationLimits(
        enabled=given.get("enabled", True),
        window=timedelta(
            milliseconds=window_ms if window_ms is not None else settings.ESCALATION_WINDOW * 1000
        ),
        max_errors=given.get("max_errors", settings.ESCALATION_MAX_ERRORS),
        max_error_rate=given.get("max_error_rate", settings.ESCALATION_MAX_ERROR_RATE),
        min_attempts=given.get("min_attempts", settings.ESCALATION_MIN_ATTEMPTS),
    )


def replan_limits(run: Run) -> ReplanLimits:
    """The run's re-plan thresholds: its plan's, settings for what it left out."""
    given = (run.policy or {}).get("replan", {})
    return ReplanLimits(
        enabled=given.get("enabled", True),
        agent_failure_ratio=given.get("agent_failure_ratio", settings.REPLAN_AGENT_FAILURE_RATIO),
        task_failures=given.get("task_failures", settings.REPLAN_TASK_FAILURES),
        max_replans=given.get("max_replans", settings.REPLAN_MAX),
        planner=given.get("planner") or settings.ORCH_PLANNER,
    )


# --------------------------------------------------------------------------- failures
def record_failure(run: Run, step: Step, attempt: int, error: ToolError, now: datetime) -> None:
    """Put a failed step attempt on record (what the triggers count and tickets show)."""
    StepFailure.objects.create(
        run_id=run.pk,
        attempt_number=step.attempt_number,
        step_id=step.pk,
        step_attempt=attempt,
        code=error.code[:64],
        message=error.message[:2000],
        retryable=error.retryable,
        created_at=now,
    )


def step_path(step: Step) -> str:
    """``agent.task.step``: how people name a step (its id says nothing to them)."""
    task = Task.objects.select_related("agent").only("name", "agent__name").get(pk=step.task_id)
    return f"{task.agent.name}.{task.name}.{step.name}"


def failures_shown(run: Run, since: datetime, limit: int = TRIGGER_ERRORS) -> list[dict[str, Any]]:
    """The run's latest failures since ``since``, oldest first, as a ticket shows them."""
    rows = list(
        StepFailure.objects.filter(run_id=run.pk, created_at__gte=since)
        .select_related("step__task__agent")
        .only(
            "step_id",
            "step_attempt",
            "code",
            "message",
            "created_at",
            "step__name",
            "step__task__name",
            "step__task__agent__name",
        )
        .order_by("-created_at", "-id")[:limit]
    )
    return [_shown(row) for row in reversed(rows)]


def _shown(row: StepFailure) -> dict[str, Any]:
    step = row.step
    return {
        "step": row.step_id,
        "path": f"{step.task.agent.name}.{step.task.name}.{step.name}",
        "attempt": row.step_attempt,
        "code": row.code,
        "message": row.message,
        "at": row.created_at.isoformat(),
    }


# --------------------------------------------------------------------------- escalate
def escalation_for(run: Run, *, retry: bool, escalate: str, retryable: bool, now: datetime) -> str:
    """Why this failed attempt escalates its run, or "" to carry on as ``decide`` said.

    ``retry``/``escalate``: the retry decision (``escalate`` is its own reason:
    backoff_exceeded, attempts_exhausted). A run already escalated does not escalate
    again (one ticket per run): its retries wait for the resolution, and a budget spent
    with `on_exhausted: escalate` is held for it too. A paused run escalates as a
    running one would (its ticket opens, its status stays paused until the resume:
    ``escalation_held``)."""
    if not retryable or run.status not in ESCALATES:
        return ""
    if escalate:
        return escalate
    if not retry or run.status == RunStatus.ESCALATED:
        return ""
    limits = escalation_limits(run)
    if not limits.enabled:
        return ""
    return window_trigger(run, limits, now)


def window_trigger(run: Run, limits: EscalationLimits, now: datetime) -> str:
    """error_burst or error_rate, by the failures on record in the window (this one
    included), or ""."""
    since = now - limits.window
    failures = StepFailure.objects.filter(run_id=run.pk, created_at__gte=since).count()
    if failures > limits.max_errors:
        return EscalationReason.ERROR_BURST
    rate = limits.max_error_rate
    # The rate needs attempts >= min_attempts and failures > rate x attempts; with few
    # failures it cannot hold, and the successes need not be counted at all.
    if rate >= 1 or failures <= rate * limits.min_attempts:
        return ""
    # Successful attempts in the window: a completed step has exactly one. Counted up to
    # what could still keep the rate at or under the threshold.
    enough = max(math.floor(failures / rate) if rate > 0 else failures, limits.min_attempts)
    successes = len(
        Step.objects.filter(
            run_id=run.pk,
            attempt_number=run.attempt_number,
            status=StepStatus.COMPLETED,
            completed_at__gte=since,
        ).values_list("pk", flat=True)[: enough + 1]
    )
    attempts = failures + successes
    if attempts >= limits.min_attempts and failures > rate * attempts:
        return EscalationReason.ERROR_RATE
    return ""


def hold_for_escalation(
    run: Run,
    step: Step,
    attempt: int,
    error: ToolError,
    reason: str,
    *,
    delay_ms: int,
    now: datetime,
) -> EscalationTicket | None:
    """The failing step waits (PENDING, not failed) and the run escalates (or adds this
    failure to the ticket it already has)."""
    transition_locked(
        step,
        StepStatus.PENDING,
        message=f"held for escalation ({reason}) after {error.code}",
        payload={**error.as_dict(), "escalation": reason, "attempt": attempt},
        updates={"next_run_at": now + timedelta(milliseconds=delay_ms), "lease_expires_at": None},
        now=now,
    )
    since = now - escalation_limits(run).window
    return escalate(run, reason=reason, errors=failures_shown(run, since), actor="engine", now=now)


def escalate(
    run: Run,
    *,
    reason: str,
    errors: list[dict[str, Any]],
    actor: str,
    now: datetime | None = None,
    severity: str = "",
    note: str = "",
) -> EscalationTicket | None:
    """RUNNING -> ESCALATED with a ticket, on-call told after commit; a run already
    escalated gets ``errors`` added to its open ticket instead. The caller holds the
    run's lock."""
    now = now or timezone.now()
    ticket = (
        EscalationTicket.objects.select_for_update()
        .filter(run_id=run.pk, status__in=OPEN_TICKET)
        .first()
    )
    if ticket is None and not reason:
        return None  # only adding to a ticket, and there is none
    if ticket is not None:
        seen = {(e.get("step"), e.get("attempt")) for e in ticket.errors}
        added = [e for e in errors if (e.get("step"), e.get("attempt")) not in seen]
        if added:
            kept = ticket.errors[:1] + (ticket.errors[1:] + added)[-(TICKET_ERRORS - 1) :]
            EscalationTicket.objects.filter(pk=ticket.pk).update(errors=kept)
            ticket.errors = kept
        return ticket
    if run.status == RunStatus.RUNNING:
        _escalated(run, reason, actor, now)
    ticket = EscalationTicket.objects.create(
        organization_id=run.organization_id,
        run_id=run.pk,
        attempt_number=run.attempt_number,
        reason=reason,
        severity=severity or SEVERITY.get(reason, Severity.HIGH),
        errors=errors[-TICKET_ERRORS:],
        opened_at=now,
        note=note,
    )
    record_event(
        run,
        EventKind.ESCALATION,
        actor=actor,
        message=f"escalation {ticket.pk} opened: {reason}",
        payload={"ticket": str(ticket.pk), "reason": reason, "errors": len(ticket.errors)},
    )
    enqueue_run_message(RunMessage.ESCALATED, run.pk, run.priority)
    return ticket


def _escalated(run: Run, reason: str, actor: str, now: datetime) -> None:
    transition(
        Run,
        run.pk,
        RunStatus.ESCALATED,
        actor=actor,
        message=f"escalated: {reason}",
        payload={"reason": reason},
        now=now,
    )
    run.status = RunStatus.ESCALATED


def escalation_held(run: Run, now: datetime) -> bool:
    """A run resumed with a ticket opened while it was paused escalates now (RUNNING ->
    ESCALATED), its held steps waiting for the resolution; False if it has none."""
    reason = (
        EscalationTicket.objects.filter(run_id=run.pk, status__in=OPEN_TICKET)
        .values_list("reason", flat=True)
        .first()
    )
    if reason is None:
        return False
    _escalated(run, reason, "engine", now)
    return True


def note_failure(run: Run, step: Step, attempt: int, error: ToolError, now: datetime) -> None:
    """A failure while the run is escalated: shown on its open ticket."""
    escalate(
        run,
        reason="",
        errors=[
            {
                "step": step.pk,
                "path": step_path(step),
                "attempt": attempt,
                "code": error.code,
                "message": error.message[:2000],
                "at": now.isoformat(),
            }
        ],
        actor="engine",
        now=now,
    )


def fresh_budgets(run: Run) -> int:
    """Give every pending step of the attempt that has failed its retries again (the
    budgets count from now); return how many. An escalation resumed does this."""
    return Step.objects.filter(
        run_id=run.pk,
        attempt_number=run.attempt_number,
        status=StepStatus.PENDING,
        failures__gt=F("retry_base_failures"),
    ).update(retry_base_attempts=F("attempts"), retry_base_failures=F("failures"))


# --------------------------------------------------------------------------- re-plan
def _failed(rows: Any) -> Any:
    """Agents or tasks that ended by a failure of their own (failed, or skipped with
    their error kept under `continue`; not skipped for a dependency or replaced)."""
    return rows.filter(
        Q(status=NodeStatus.FAILED)
        | (
            Q(status=NodeStatus.SKIPPED, last_error__isnull=False)
            & ~Q(last_error__code__in=NOT_FAILURES)
        )
    )


def failures_of(
    run: Run, *, also: Agent | Task | None = None, error: dict[str, Any] | None = None
) -> dict[str, Any]:
    """What failed in the run's current attempt, for a planner: agents and tasks that
    failed, and steps that failed or wait for an escalation, with codes and messages.
    ``also``: a node about to fail with ``error``, counted with them."""
    agents = Agent.objects.filter(run_id=run.pk, attempt_number=run.attempt_number)
    tasks = Task.objects.filter(run_id=run.pk, attempt_number=run.attempt_number)
    failed_agents = {
        name: error or {} for name, error in _failed(agents).values_list("name", "last_error")
    }
    failed_tasks = {
        (agent, name): error or {}
        for agent, name, error in _failed(tasks).values_list("agent__name", "name", "last_error")
    }
    if isinstance(also, Agent):
        failed_agents.setdefault(also.name, error or {})
    elif isinstance(also, Task):
        agent_name = Agent.objects.values_list("name", flat=True).get(pk=also.agent_id)
        failed_tasks.setdefault((agent_name, also.name), error or {})
    steps = (
        Step.objects.filter(run_id=run.pk, attempt_number=run.attempt_number)
        .filter(
            Q(status=StepStatus.FAILED, handled=False)
            | Q(status=StepStatus.SKIPPED, error__isnull=False)
            | Q(status=StepStatus.PENDING, failures__gt=F("retry_base_failures"))
        )
        .exclude(error__code__in=NOT_FAILURES)
        .values_list("task__agent__name", "task__name", "name", "status", "attempts", "error")
    )
    return {
        "agents": [
            {"agent": name, "code": e.get("code", ""), "message": e.get("message", "")}
            for name, e in sorted(failed_agents.items())
        ],
        "tasks": [
            {"agent": a, "task": t, "code": e.get("code", ""), "message": e.get("message", "")}
            for (a, t), e in sorted(failed_tasks.items())
        ],
        "steps": [
            {
                "agent": agent,
                "task": task,
                "step": name,
                "status": status,
                "attempts": attempts,
                "code": (error or {}).get("code", ""),
                "message": (error or {}).get("message", ""),
            }
            for agent, task, name, status, attempts, error in steps[:500]
        ],
    }


def failure_ends_run(run: Run, parent: Run | Agent | Task, child: Agent | Task) -> bool:
    """Whether ``child`` failing for good ends the run's attempt now (fail-fast up to the
    run, or a run-level retry): then there is no running run to re-plan."""
    if isinstance(parent, Run):
        return parent.failure_mode != FailureMode.CONTINUE
    if isinstance(parent, Agent):
        from_agent = parent.failure_mode
        if from_agent == FailureMode.CONTINUE:
            return False
        if from_agent == FailureMode.RETRY and parent.retry_count < MAX_LEVEL_RETRIES:
            return False
        return run.failure_mode != FailureMode.CONTINUE
    return False


def consider_replan(
    run: Run, parent: Run | Agent | Task, child: Agent | Task, error: dict[str, Any]
) -> Replan | None:
    """``child`` is failing for good and the run goes on: ask for a re-plan when more
    than the run's thresholds have failed (at most `max_replans`, one at a time)."""
    if failure_ends_run(run, parent, child):
        return None
    state = Run.objects.values("status", "replan_count", "replan_pending_since", "agent_count").get(
        pk=run.pk
    )
    if state["status"] != RunStatus.RUNNING or state["replan_pending_since"] is not None:
        return None
    limits = replan_limits(run)
    if not limits.enabled or state["replan_count"] >= limits.max_replans:
        return None
    failures = failures_of(run, also=child, error=error)
    trigger = ""
    agent_count = max(state["agent_count"], 1)
    if len(failures["agents"]) > limits.agent_failure_ratio * agent_count:
        trigger = ReplanTrigger.AGENTS_FAILED
    elif len(failures["tasks"]) > limits.task_failures:
        trigger = ReplanTrigger.TASKS_FAILED
    if not trigger:
        return None
    return request_replan(run, trigger=trigger, failures=failures, actor="engine")


def request_replan(
    run: Run,
    *,
    trigger: str,
    failures: dict[str, Any],
    actor: str,
    now: datetime | None = None,
) -> Replan:
    """Ask the run's planner for new agents: a Replan row, the run held open (one more
    open child) until it answers, and the request sent after commit. The caller holds
    the run's lock and has checked the cap."""
    now = now or timezone.now()
    limits = replan_limits(run)
    number = Run.objects.values_list("replan_count", flat=True).get(pk=run.pk) + 1
    Run.objects.filter(pk=run.pk).update(
        replan_count=number,
        replan_pending_since=now,
        open_children=F("open_children") + 1,
    )
    run.replan_count, run.replan_pending_since = number, now
    run.open_children += 1
    replan = Replan.objects.create(
        run_id=run.pk,
        attempt_number=run.attempt_number,
        number=number,
        trigger=trigger,
        planner=limits.planner,
        failures=failures,
        requested_by=actor,
        requested_at=now,
    )
    record_event(
        run,
        EventKind.REPLAN,
        actor=actor,
        message=f"re-plan {number} of {limits.max_replans} asked of {limits.planner}: {trigger}",
        payload={
            "replan": number,
            "trigger": trigger,
            "planner": limits.planner,
            "failed_agents": len(failures.get("agents", [])),
            "failed_tasks": len(failures.get("tasks", [])),
        },
    )
    enqueue_run_message(RunMessage.REPLAN, run.pk, run.priority)
    return replan
