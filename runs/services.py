"""A run's lifecycle below the engine, one service function each: create it, take its
attempt (``run_pick_up_locked``), complete, fail, cancel, pause, resume, retry, requeue
and delete it, and what every ending shares (``_ended``).

The other operations on a run are services of their rooms, each one function: its
start and pick-up as a worker makes them (``runs.engine.start``, ``runs.engine.control``),
a step's recording (``runs.engine.outcomes``), what people decide (``runs.people``), the
end of a step's wait (``runs.waits``), a fork (``runs.forks``). API views, admin
actions, CLI commands and Celery tasks call those and these, and nothing else changes a
run's state. Each service runs in one transaction, locks the run row first
(the lock order everywhere is run -> agent -> task -> step, so that two services never
wait on each other in a cycle), changes state only through ``runs.transitions`` (FOR NO
KEY UPDATE locks; see there) and records what it did as RunEvents.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, NamedTuple
from uuid import UUID

from django.db import connection, transaction
from django.utils import timezone

from billing.models import Organization
from billing.services import (
    InsufficientCredits,
    to_credits,
)
from common import eventstreams, tracing
from common.templates import Reference, UnresolvedReference, render_value, resolve_in
from common.text import storable_text
from runs import catalogue
from runs.admission import run_admission, step_admission
from runs.materialize import materialize
from runs.models import (
    Agent,
    EscalationStatus,
    EscalationTicket,
    EventKind,
    Replan,
    ReplanStatus,
    Resolution,
    Run,
    RunAttempt,
    Step,
    Task,
)
from runs.outbox import RunMessage, enqueue_run_message, revoke_running_steps
from runs.plan import Plan, PlanError, PlanInvalid, parse_plan
from runs.plan.fields import CONCURRENCY_KEY_MAX_LENGTH
from runs.reservation import plan_reservation
from runs.reuse import retry_reuse
from runs.states import (
    NODE_OPEN,
    RUN_TERMINAL,
    STEP_OPEN,
    InvalidTransition,
    NodeStatus,
    RunStatus,
    StepStatus,
)
from runs.transitions import (
    record_event,
    transition,
    transition_many,
)

RunId = UUID | str
CHILD_MODES = ("sync", "async_poll", "async_callback")


class RunNotFound(Exception):
    code = "not_found"


class RunDeleted(Exception):
    code = "run_deleted"


class StepNotFound(Exception):
    code = "not_found"


def error_payload(code: str, message: str, **extra: Any) -> dict[str, Any]:
    return {"code": code, "message": message, **extra}


# What the engine reads of a run on every step: everything but the large fields (a wide
# run's plan is tens of kilobytes; reading it on every step would make a step's cost grow
# with the run).
_HEAVY = {"plan", "variables", "timeouts", "last_error", "policy", "reuse"}
_ALL = [f.attname for f in Run._meta.concrete_fields]
_LIGHT = [name for name in _ALL if name not in _HEAVY]
# Psycopg gives each column as the model wants it but JSON, which Django's JSONField
# decodes itself (all of them are among the heavy fields).
_DECODED = {
    f.attname: f.from_db_value for f in Run._meta.concrete_fields if hasattr(f, "from_db_value")
}


def _lock_sql(columns: list[str], *, in_organization: bool) -> str:
    """The statement that locks a run: the gate first (a one-time filter, evaluated before
    any row is locked: the lock order is gate, then rows), then the run's row. Written
    once per shape at import, not built by the ORM per call: every service locks a run."""
    return (
        f"SELECT {', '.join(connection.ops.quote_name(name) for name in columns)} "  # noqa: S608
        "FROM runs_run WHERE id = %s "
        + ("AND organization_id = %s " if in_organization else "")
        + "AND (SELECT runs.run_gate(%s)) FOR NO KEY UPDATE"
    )


_LOCK_SQL = {
    (light, in_organization): _lock_sql(_LIGHT if light else _ALL, in_organization=in_organization)
    for light in (False, True)
    for in_organization in (False, True)
}


def lock_run(
    run_id: RunId, organization: Organization | None = None, *, light: bool = False
) -> Run:
    """The run, locked for the rest of the transaction; scoped to ``organization``. Its
    gate is closed first (``transitions.lock_gate``): no recording of its steps is under
    way until the transaction ends.

    ``light`` leaves out the plan and other large fields: the engine moves a run forward
    on every step without them.
    """
    key = _run_key(run_id)
    columns = _LIGHT if light else _ALL
    params: list[Any] = [key, organization.pk, key] if organization is not None else [key, key]
    with connection.cursor() as cursor:
        cursor.execute(_LOCK_SQL[light, organization is not None], params)
        row = cursor.fetchone()
    if row is None:
        raise RunNotFound(f"run {run_id} not found")
    values = [
        _DECODED[name](value, None, connection) if name in _DECODED else value
        for name, value in zip(columns, row, strict=True)
    ]
    return Run.from_db(connection.alias, columns, values)


def _run_key(run_id: RunId) -> UUID:
    """The run id as a UUID; a malformed one is a run that does not exist."""
    try:
        return run_id if isinstance(run_id, UUID) else UUID(str(run_id))
    except ValueError as exc:
        raise RunNotFound(f"run {run_id} not found") from exc


def require_source(run: Run, source: str, target: str) -> bool:
    """For engine-side steps that have one source state: False if already at ``target``.

    The table alone would let, say, RETRYING's requeue (-> PENDING) start a CREATED run
    without an attempt; these services only ever continue their own step.
    """
    if run.status == target:
        return False
    if run.status != source:
        raise InvalidTransition("run", run.status, target, f"only from {source}")
    return True


def current_attempt(run: Run) -> RunAttempt:
    return RunAttempt.objects.get(run=run, attempt_number=run.attempt_number)


def plan_of(run: Run) -> Plan:
    return parse_plan(run.plan)


def replanned_plan_json(run: Run) -> dict[str, Any]:
    """The run's plan as submitted, with the agents the current attempt's re-plans added
    after its own (``runs.people.replanning``): what the attempt runs."""
    fragments = Replan.objects.filter(
        run=run, attempt_number=run.attempt_number, status=ReplanStatus.SPAWNED
    ).order_by("number")
    added = [
        agent
        for fragment in fragments.values_list("fragment", flat=True)
        for agent in fragment or []
    ]
    plan = dict(run.plan)
    plan["agents"] = list(plan.get("agents") or []) + added
    return plan


def replanned_plan(run: Run) -> Plan:
    """``replanned_plan_json``, validated: the typed plan of the running attempt."""
    if run.replan_count == 0:
        return plan_of(run)
    return parse_plan(replanned_plan_json(run))


# --------------------------------------------------------------------------- create
@dataclass(frozen=True)
class ChildOf:
    """Where a child run comes from: the `run` step attempt that starts it
    (``runs.engine.waiting``), how that step waits for it, and its depth."""

    run: Run
    step: Step
    attempt: int
    mode: str
    depth: int


def run_create(
    *,
    organization: Organization,
    plan: Any,
    actor: str = "system",
    size_hint: int | None = None,
    parent: ChildOf | None = None,
) -> Run:
    """Validate the plan and store a CREATED run. Nothing is stored if the plan is invalid.

    The run keeps ``plan`` exactly as submitted; its parsed form (defaults filled in) is
    derived from it again when a worker materialises the run.
    """
    return run_create_checked(
        organization=organization, plan=plan, actor=actor, size_hint=size_hint, parent=parent
    ).run


class Created(NamedTuple):
    """A run ``run_create_checked`` stored, and its plan as it checked it in full."""

    run: Run
    plan: Plan


def run_create_checked(
    *,
    organization: Organization,
    plan: Any,
    actor: str = "system",
    size_hint: int | None = None,
    parent: ChildOf | None = None,
    parsed: Plan | None = None,
) -> Created:
    """``run_create``, answering the typed plan with the run: a caller that starts the
    run in the same transaction hands it to ``run_start`` (``plan``), and the request
    reads its plan once. ``parsed``: ``plan`` parsed already against the organization's
    tools (a fork's), not read again."""
    if parsed is None:
        parsed = parse_plan(
            plan, size_hint=size_hint, tools=catalogue.OrganizationCatalogue(organization.pk)
        )
    problems = step_admission.plan_problems(organization.pk, parsed)
    if problems:
        raise PlanInvalid(problems)
    key, most = concurrency_of(parsed)
    lineage: dict[str, Any] = {}
    if parent is not None:
        lineage = {
            "parent_run": parent.run,
            "parent_step": parent.step,
            "parent_step_attempt": parent.attempt,
            "parent_mode": parent.mode,
            "depth": parent.depth,
        }
    # The run's trace: the creating request's (a child run: a trace of its own, linked
    # to its parent step's attempt), kept on the row (common.tracing).
    trace_context = tracing.run_context(
        linked_to=parent.step.trace_context if parent is not None else "",
        attributes={"orchestrator.run.name": parsed.name},
    )
    with transaction.atomic():
        run = Run.objects.create(
            **lineage,
            trace_context=trace_context,
            organization=organization,
            name=parsed.name,
            priority=parsed.priority,
            plan=plan,
            failure_mode=parsed.failure_mode,
            mode=parsed.mode,
            max_attempts=parsed.max_attempts,
            max_agents=parsed.max_agents,
            variables=parsed.variables,
            timeouts=parsed.timeouts_ms,
            policy=parsed.policy,
            concurrency_key=key,
            concurrency_max=most,
            created_by=actor,
        )
        if parent is None:  # the creating request's span names its run
            tracing.annotate(run_id=str(run.pk))
        record_event(
            run,
            EventKind.CREATED,
            actor=actor,
            message=f"run created with {parsed.step_count} steps",
            payload={"priority": parsed.priority, "steps": parsed.step_count},
        )
        return Created(run, parsed)


def concurrency_of(plan: Plan) -> tuple[str, int]:
    """The plan's concurrency key, its templates rendered from the run's variables, and
    its `max_runs`; ("", 0) without one. A key that does not render is a plan problem."""
    if plan.concurrency is None:
        return "", 0

    def resolve(ref: Reference) -> Any:
        return resolve_in({"variables": plan.variables}, ref)

    try:
        value = render_value(plan.concurrency.key, resolve)
    except UnresolvedReference as exc:
        raise PlanInvalid([PlanError("concurrency.key", str(exc))]) from None
    key = storable_text(value if isinstance(value, str) else json.dumps(value, sort_keys=True))
    key = key.strip()
    if not key or len(key) > CONCURRENCY_KEY_MAX_LENGTH:
        raise PlanInvalid(
            [
                PlanError(
                    "concurrency.key",
                    f"renders to {len(key)} characters; 1 to {CONCURRENCY_KEY_MAX_LENGTH} allowed",
                )
            ]
        )
    return key, plan.concurrency.max_runs


# --------------------------------------------------------------------------- pick up
def short_of_credits(organization_id: UUID, amount: Decimal) -> InsufficientCredits:
    """A reservation the organization could not cover (runs.attempt_open wrote nothing):
    402 to an API client."""
    available = Organization.objects.values_list("credits_available", flat=True).get(
        pk=organization_id
    )
    return InsufficientCredits(amount, available)


def _open_attempt(run: Run, actor: str) -> RunAttempt:
    """Open the run's current attempt with its credits reserved (``runs.attempt_open``,
    same transaction)."""
    amount = to_credits(plan_reservation(plan_of(run), run.reuse))
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT runs.attempt_open(%s, %s::smallint, %s, %s)",
            [run.pk, run.attempt_number, amount, actor],
        )
        attempt_id = cursor.fetchone()[0]
    if attempt_id is None:
        raise short_of_credits(run.organization_id, amount)
    eventstreams.events_written(run.pk)
    return RunAttempt.from_db(
        connection.alias,
        ["id", "run_id", "attempt_number"],
        [attempt_id, run.pk, run.attempt_number],
    )


@transaction.atomic
def run_pick_up(*, run_id: RunId, actor: str = "worker") -> tuple[Run, bool]:
    """PENDING -> RUNNING and materialise the attempt's agents, tasks and steps.

    Returns ``(run, picked)``: ``picked`` is False when the run was not PENDING (a
    duplicate delivery, or a run cancelled while queued), which callers treat as a no-op.
    """
    run = lock_run(run_id)
    if run.status != RunStatus.PENDING:
        return run, False
    return run_pick_up_locked(run, plan_of(run), actor=actor), True


def run_pick_up_locked(
    run: Run, plan: Plan, *, actor: str = "worker", attempt: RunAttempt | None = None
) -> Run:
    """``run_pick_up`` for a PENDING run already locked (with its plan) in the caller's
    transaction, its plan parsed: the worker's pick-up parses the plan before it writes
    anything, so that a plan which no longer validates fails the run without a
    savepoint to roll back to. ``attempt``: the current one, when the caller has it
    (a start that begins the run opened it)."""
    attempt = attempt or current_attempt(run)
    now = timezone.now()
    agent_count = materialize(run, attempt, plan, actor=actor, now=now)
    # The caller's copy of the row, as runs.run_pick_up left it.
    run.status, run.status_changed_at, run.updated_at = RunStatus.RUNNING, now, now
    if run.picked_up_at is None:
        run.picked_up_at = now
    run.agent_count = run.open_children = agent_count
    run.active_children = run.waiting_approvals = 0
    run.last_heartbeat = now
    eventstreams.events_written(run.pk)  # the function wrote the pick-up's event
    return run


# --------------------------------------------------------------------------- finishing
def _close_children(run: Run, to_status: str, actor: str, message: str) -> None:
    """Move every unfinished agent, task and step of the current attempt to ``to_status``."""
    node_to = NodeStatus(to_status)
    step_to = StepStatus(to_status)
    attempt = run.attempt_number
    transition_many(
        Agent,
        Agent.objects.filter(run=run, attempt_number=attempt),
        node_to,
        from_states=NODE_OPEN,
        actor=actor,
        message=message,
    )
    transition_many(
        Task,
        Task.objects.filter(run=run, attempt_number=attempt),
        node_to,
        from_states=NODE_OPEN,
        actor=actor,
        message=message,
    )
    steps = Step.objects.filter(run=run, attempt_number=attempt)
    revoke_running_steps(steps)
    transition_many(Step, steps, step_to, from_states=STEP_OPEN, actor=actor, message=message)


def _finish_attempt(run: Run, actor: str = "system") -> None:
    """Close the current attempt on a terminal state and settle its credits with it
    (``_ended`` first)."""
    _ended(run, actor)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT runs.attempt_close(%s, %s::smallint, %s, %s, %s)",
            [run.pk, run.attempt_number, run.status, run.completed_at or timezone.now(), actor],
        )
    eventstreams.events_written(run.pk)  # a refund's event


def _ended(run: Run, actor: str) -> None:
    """What a run's end asks beyond its rows: a child run's parent is told, after commit
    (``runs.waits.children``); an escalation still open is resolved by the run's end, and a
    re-plan not yet answered is dropped; the organization's waiting runs are looked at
    again, and the run's places in rate limits' lines given back."""
    if run.parent_run_id is not None and run.parent_notified_at is None:
        enqueue_run_message(RunMessage.CHILD_ENDED, run.pk, run.priority)
    _close_escalations(run, actor)
    run_admission.released(run)
    step_admission.release_run(run)


def _close_escalations(run: Run, actor: str) -> None:
    now = timezone.now()
    error = run.last_error or {}
    timed_out = error.get("code") == "escalation_timeout"
    EscalationTicket.objects.filter(run=run).exclude(status=EscalationStatus.RESOLVED).update(
        status=EscalationStatus.RESOLVED,
        resolved_at=now,
        resolved_by=actor,
        resolution=Resolution.ESCALATION_TIMEOUT if timed_out else Resolution.RUN_ENDED,
        note=f"run {run.status}: {error.get('code', '')} {error.get('message', '')}".strip()[:2000],
    )
    if run.replan_pending_since is not None:
        Run.objects.filter(pk=run.pk).update(replan_pending_since=None)
        Replan.objects.filter(run=run, status=ReplanStatus.REQUESTED).update(
            status=ReplanStatus.DROPPED, finished_at=now
        )


@transaction.atomic
def run_complete(*, run_id: RunId, actor: str = "system") -> Run:
    """RUNNING -> COMPLETED, when every agent has completed (or was skipped)."""
    run = lock_run(run_id)
    if run.status != RunStatus.COMPLETED:
        unfinished = Agent.objects.filter(run=run, attempt_number=run.attempt_number).exclude(
            status__in=[NodeStatus.COMPLETED, NodeStatus.SKIPPED]
        )
        if unfinished.exists():
            raise InvalidTransition(
                "run", run.status, RunStatus.COMPLETED, "some agents have not completed"
            )
        if run.status != RunStatus.RUNNING:
            raise InvalidTransition("run", run.status, RunStatus.COMPLETED)
        # The database's rule, the hot path's too (runs/sql/run_finish.sql): the
        # run's row, its event, its attempt closed and settled.
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT runs.run_finish(%s, %s::smallint, 0, %s, %s)",
                [run.pk, run.attempt_number, actor, timezone.now()],
            )
        eventstreams.events_written(run.pk)
        run.refresh_from_db()
        _ended(run, actor)
    return run


@transaction.atomic
def run_fail(
    *,
    run_id: RunId,
    code: str,
    message: str,
    actor: str = "system",
) -> Run:
    """Fail the run with ``last_error``; its unfinished work ends FAILED (or as asked)."""
    run = lock_run(run_id)
    message = storable_text(message)
    error = error_payload(code, message)
    result = transition(
        Run,
        run.pk,
        RunStatus.FAILED,
        actor=actor,
        message=message,
        payload=error,
        updates={"last_error": error},
    )
    if result.changed:
        # Unfinished agents fail with the run (a FAILED run has a FAILED agent),
        # paused ones too (a paused run failed by its timeout or an operator);
        # their unfinished tasks and steps are cancelled.
        transition_many(
            Agent,
            Agent.objects.filter(run=run, attempt_number=run.attempt_number),
            NodeStatus.FAILED,
            from_states=NODE_OPEN,
            actor=actor,
            message=message,
            updates={"last_error": error},
        )
        _close_children(result.obj, "cancelled", actor, message)
        # Children this run waits for are of no use to it now; one started to run on
        # its own (async_poll) goes on.
        _cancel_children(
            result.obj, f"parent run failed: {message}", actor, modes=("sync", "async_callback")
        )
        _finish_attempt(result.obj, actor)
    return result.obj


def _cancel_children(run: Run, reason: str, actor: str, modes: tuple[str, ...]) -> None:
    """Cancel ``run``'s child runs (of the ``modes`` given) that have not ended; each
    cancels its own in turn (the lock order is parent before child)."""
    children = Run.objects.filter(parent_run=run, parent_mode__in=modes).exclude(
        status__in=RUN_TERMINAL
    )
    for child_id in children.values_list("pk", flat=True):
        run_cancel(run_id=child_id, reason=reason[:1000], actor=actor)


# --------------------------------------------------------------------------- control
@transaction.atomic
def run_cancel(
    *,
    run_id: RunId,
    reason: str = "",
    organization: Organization | None = None,
    actor: str = "system",
    error_code: str = "",
) -> Run:
    """Cancel from any non-terminal state; unfinished children end CANCELLED.

    Running steps are terminated (Celery revoke with terminate, after commit) and long
    tools notice on their own (their step is no longer RUNNING). ``error_code`` records a
    `last_error` when the cancellation is not a person's decision (paused too long).
    """
    run = lock_run(run_id, organization)
    reason = storable_text(reason.strip()[:1000]) or "cancelled"
    # Every way a run ends names its condition in last_error (as every abort does): a
    # person's cancel is `cancelled`, the sweep's says which timeout.
    updates: dict[str, Any] = {
        "cancel_reason": reason,
        "last_error": error_payload(error_code or "cancelled", reason),
    }
    result = transition(
        Run,
        run.pk,
        RunStatus.CANCELLED,
        actor=actor,
        message=reason,
        payload={"reason": reason},
        updates=updates,
    )
    if result.changed:
        _close_children(result.obj, "cancelled", actor, reason)
        _cancel_children(result.obj, f"parent run cancelled: {reason}", actor, modes=CHILD_MODES)
        if result.obj.attempt_number:
            _finish_attempt(result.obj, actor)
    return result.obj


@transaction.atomic
def run_pause(
    *, run_id: RunId, organization: Organization | None = None, actor: str = "system"
) -> Run:
    """RUNNING -> PAUSED: nothing new starts; running steps finish and keep their results."""
    run = lock_run(run_id, organization)
    result = transition(Run, run.pk, RunStatus.PAUSED, actor=actor)
    if result.changed:
        step_admission.release_run(result.obj, paused=True)
        _move_work(
            run,
            nodes=([NodeStatus.PENDING, NodeStatus.RUNNING], NodeStatus.PAUSED),
            steps=([StepStatus.PENDING], StepStatus.PAUSED),
            actor=actor,
        )
    return result.obj


def _move_work(
    run: Run,
    *,
    nodes: tuple[list[str], str],
    steps: tuple[list[str], str],
    actor: str,
) -> None:
    """Move the current attempt's agents and tasks, then its steps, from the listed
    states to another (pause and resume: running steps are left to finish)."""
    attempt = run.attempt_number
    for model in (Agent, Task):
        transition_many(
            model,  # type: ignore[type-var]
            model.objects.filter(run=run, attempt_number=attempt),
            nodes[1],
            from_states=nodes[0],
            actor=actor,
        )
    transition_many(
        Step,
        Step.objects.filter(run=run, attempt_number=attempt),
        steps[1],
        from_states=steps[0],
        actor=actor,
    )


@transaction.atomic
def run_resume(
    *, run_id: RunId, organization: Organization | None = None, actor: str = "system"
) -> Run:
    """PAUSED -> RESUMING: paused agents, tasks and steps go back to PENDING.

    A worker then re-dispatches what is pending (the resume task, published after
    commit) and moves the run on to RUNNING (``run_resumed``).
    """
    run = lock_run(run_id, organization)
    paused_since = run.status_changed_at
    result = transition(Run, run.pk, RunStatus.RESUMING, actor=actor)
    if result.changed:
        _move_work(
            run,
            nodes=([NodeStatus.PAUSED], NodeStatus.PENDING),
            steps=([StepStatus.PAUSED], StepStatus.PENDING),
            actor=actor,
        )
        step_admission.timers_resumed(run, result.obj.status_changed_at - paused_since)
        enqueue_run_message(RunMessage.RESUME, run.pk, run.priority)
    return result.obj


@transaction.atomic
def run_resumed(*, run_id: RunId, actor: str = "worker") -> Run:
    """RESUMING -> RUNNING once the pending work has been re-enqueued."""
    run = lock_run(run_id)
    if not require_source(run, RunStatus.RESUMING, RunStatus.RUNNING):
        return run
    now = timezone.now()
    return transition(
        Run, run.pk, RunStatus.RUNNING, actor=actor, now=now, updates={"last_heartbeat": now}
    ).obj


class AttemptsExhausted(Exception):
    code = "attempts_exhausted"


@transaction.atomic
def run_retry(
    *,
    run_id: RunId,
    organization: Organization | None = None,
    actor: str = "system",
    reuse: str = "none",
) -> Run:
    """FAILED -> RETRYING with a new attempt; earlier attempts keep all their records.

    ``reuse``: ``"none"``, every step runs again; ``"completed"``, the steps the ended
    attempt completed are taken as completed, with their output, without running or
    being charged again (``runs.reuse``), and the reservation covers the rest.
    Already RETRYING: returned unchanged. Refused once ``max_attempts`` is reached.
    """
    run = lock_run(run_id, organization)
    if run.status == RunStatus.RETRYING:
        return run
    if run.status == RunStatus.FAILED and run.attempt_number >= run.max_attempts:
        raise AttemptsExhausted(
            f"run {run.pk} has used {run.attempt_number} of {run.max_attempts} attempts"
        )
    number = run.attempt_number + 1
    reused = retry_reuse(run, reuse)
    result = transition(
        Run,
        run.pk,
        RunStatus.RETRYING,
        actor=actor,
        payload={"attempt_number": number, "reuse": reuse, "reused_steps": len(reused)},
        # The new attempt waits for admission like any run (runs.admission.run_admission).
        updates={
            "attempt_number": number,
            "agent_count": 0,
            "last_error": None,
            "admitted_at": None,
            "queued_reason": "",
            "reuse": reused,
        },
    )
    _open_attempt(result.obj, actor)
    enqueue_run_message(RunMessage.PICK_UP, result.obj.pk, result.obj.priority)
    return result.obj


@transaction.atomic
def run_requeue(*, run_id: RunId, actor: str = "worker") -> Run:
    """RETRYING -> PENDING: a worker took the retry's message (then picks the run up)."""
    run = lock_run(run_id)
    if not require_source(run, RunStatus.RETRYING, RunStatus.PENDING):
        return run
    return transition(Run, run.pk, RunStatus.PENDING, actor=actor).obj


@transaction.atomic
def run_delete(
    *, run_id: RunId, organization: Organization | None = None, actor: str = "system"
) -> Run:
    """Soft delete, CREATED only: the run is cancelled and hidden from lists."""
    run = lock_run(run_id, organization)
    if run.deleted_at is not None:
        return run
    if run.status != RunStatus.CREATED:
        raise InvalidTransition("run", run.status, "deleted", "only a created run can be deleted")
    run = transition(
        Run,
        run.pk,
        RunStatus.CANCELLED,
        actor=actor,
        message="deleted",
        updates={"deleted_at": timezone.now(), "cancel_reason": "deleted"},
    ).obj
    return run
