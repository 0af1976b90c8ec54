"""The execution engine: how a run's plan becomes Celery messages, and how each finished
step moves the run forward.

One scheme covers every level (agents of a run, tasks of an agent, steps of a task):
each child has a count of dependencies it still waits for and the names of the siblings
that wait for it. A sequential parent is a chain (each child waits for the one before),
a parallel parent has no edges, a dag has its own. When a child finishes, the same
transaction decrements its dependents' counts and dispatches the children that became
ready, as long as the parent's concurrency limit allows; when a parent's last child
finishes, the parent finishes and the same happens one level up. Step messages are
published after commit (``dispatch.Outbox``), one message per step attempt, carrying
only the step id: a 1,000-step chain costs what 1,000 one-link chains cost, and a
2,000-wide fan-out joins on a counter instead of chord_unlock polling.

Every function here runs inside a transaction that holds the run's row lock (taken
first, so the lock order run -> agent -> task -> step holds everywhere). Only one engine
transaction per run is in flight at a time, which is what keeps the counters exact.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import F
from django.utils import timezone

from billing.services import BudgetExhausted, InsufficientCredits, credits_charge
from orchestrator.dispatch import Outbox, StepMessage, revoke_running_steps
from runs import services
from runs.materialize import step_row, step_rows, task_rows, wiring
from runs.models import Agent, EventKind, FailureMode, Mode, Run, Step, Task
from runs.spec import PlanInvalid, RetryPolicy, StepPlan, parse_plan
from runs.states import NODE_OPEN, NodeStatus, RunStatus, StepStatus
from runs.transitions import record_event, transition, transition_many

MAX_LEVEL_RETRIES = 3  # seed 000 section 3: at most 3 retries of a task, agent or run
OPEN_STEP = (
    StepStatus.PENDING,
    StepStatus.RUNNING,
    StepStatus.WAITING_APPROVAL,
    StepStatus.PAUSED,
)


@dataclass(frozen=True)
class Failure:
    code: str
    message: str

    def as_error(self, **extra: Any) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, **extra}


def step_timeout_s(step: Step) -> float:
    if step.timeout_ms:
        return step.timeout_ms / 1000
    return float(settings.ENGINE_DEFAULT_STEP_TIMEOUT)


def step_from_row(values: dict[str, Any]) -> Step:
    """A Step built from raw columns (the rest deferred), as Django would load it."""
    names = [f.attname for f in Step._meta.concrete_fields if f.attname in values]
    return Step.from_db("default", names, [values[name] for name in names])


def _model(node: Run | Agent | Task | Step) -> Any:
    """The node's model class, typed loosely: the engine treats the levels alike."""
    return type(node)


def _row(node: Run | Agent | Task | Step) -> Any:
    """A queryset of just ``node``, for F() updates of its counters."""
    return _model(node).objects.filter(pk=node.pk)


# --------------------------------------------------------------------------- dispatch
def pick_up(run_id: Any, actor: str = "worker") -> bool:
    """(RETRYING ->) PENDING -> RUNNING: materialise the plan and dispatch what is ready.

    A stored plan that no longer validates (the validator grew stricter since the run
    was created) fails the run with `invalid_plan` rather than leaving it pending.
    """
    with transaction.atomic():
        if services.lock_run(run_id, light=True).status == RunStatus.RETRYING:
            services.run_requeue(run_id=run_id, actor=actor)
        try:
            with transaction.atomic():
                run, picked = services.run_pick_up(run_id=run_id, actor=actor)
        except PlanInvalid as exc:
            services.run_fail(
                run_id=run_id, code="invalid_plan", message=str(exc)[:2000], actor=actor
            )
            return False

        if picked:
            dispatch_agents(run, Outbox())
            finish_if_done(run)
        return picked


def dispatch_agents(run: Run, outbox: Outbox) -> None:
    if run.status != RunStatus.RUNNING:
        return
    free = run.max_agents - run.active_children
    if free <= 0:
        return
    ready = list(
        Agent.objects.filter(
            run=run,
            attempt_number=run.attempt_number,
            status=NodeStatus.PENDING,
            pending_dependencies=0,
            dispatched_at__isnull=True,
        ).order_by("position")[:free]
    )
    now = timezone.now()
    for agent in ready:
        agent = transition(
            Agent, agent.pk, NodeStatus.RUNNING, updates={"dispatched_at": now}, now=now
        ).obj
        run.active_children += 1
        Run.objects.filter(pk=run.pk).update(active_children=F("active_children") + 1)
        dispatch_tasks(run, agent, outbox)


def dispatch_tasks(run: Run, agent: Agent, outbox: Outbox) -> None:
    if run.status != RunStatus.RUNNING or agent.status != NodeStatus.RUNNING:
        return
    free = agent.max_concurrent_tasks - agent.active_children
    if free <= 0:
        return
    ready = list(
        Task.objects.filter(
            agent=agent,
            generation=agent.retry_count,
            status=NodeStatus.PENDING,
            pending_dependencies=0,
            dispatched_at__isnull=True,
        ).order_by("position")[:free]
    )
    if not ready:
        return
    now = timezone.now()
    started = transition_many(
        Task,
        Task.objects.filter(pk__in=[task.pk for task in ready]),
        NodeStatus.RUNNING,
        from_states=[NodeStatus.PENDING],
        updates={"dispatched_at": now},
        now=now,
    )
    agent.active_children += len(started)
    Agent.objects.filter(pk=agent.pk).update(active_children=F("active_children") + len(started))
    for task in sorted(started, key=lambda t: t.position):
        dispatch_steps(run, task, outbox)


_DISPATCH_STEPS_SQL = """
WITH ready AS (
    SELECT id FROM runs_step
    WHERE task_id = %(task)s AND generation = %(generation)s AND status = 'pending'
      AND pending_dependencies = 0 AND dispatched_at IS NULL
    ORDER BY position
    LIMIT %(limit)s
)
UPDATE runs_step AS s SET dispatched_at = %(now)s
FROM ready WHERE s.id = ready.id
RETURNING s.id, s.tool, s.timeout_ms, s.run_id, s.attempt_number, s.status
"""


def dispatch_steps(run: Run, task: Task, outbox: Outbox) -> None:
    """Publish the task's ready steps, up to its concurrency limit."""
    if run.status != RunStatus.RUNNING or task.status != NodeStatus.RUNNING:
        return
    free = task.max_concurrent_steps - task.active_children
    if free <= 0:
        return
    now = timezone.now()
    with connection.cursor() as cursor:
        # Pick the next ready steps and mark them dispatched, in one statement.
        cursor.execute(
            _DISPATCH_STEPS_SQL,
            {"task": task.pk, "generation": task.retry_count, "limit": free, "now": now},
        )
        columns = ["id", "tool", "timeout_ms", "run_id", "attempt_number", "status"]
        ready = [step_from_row(dict(zip(columns, row, strict=True))) for row in cursor.fetchall()]

    if not ready:
        return

    task.active_children += len(ready)
    Task.objects.filter(pk=task.pk).update(active_children=F("active_children") + len(ready))
    approvals = [step for step in ready if step.tool == "approval"]
    if approvals:
        # Never executed by a worker: the step waits for approve() or reject().
        transition_many(
            Step,
            Step.objects.filter(pk__in=[step.pk for step in approvals]),
            StepStatus.WAITING_APPROVAL,
            from_states=[StepStatus.PENDING],
            message="waiting for approval",
            now=now,
        )
        run.waiting_approvals += len(approvals)
        Run.objects.filter(pk=run.pk).update(
            waiting_approvals=F("waiting_approvals") + len(approvals)
        )
    for step in ready:
        if step.tool != "approval":
            outbox.add(StepMessage(step.pk, run.priority, step_timeout_s(step)))
    if approvals:
        update_waiting_state(run)


def update_waiting_state(run: Run) -> None:
    """RUNNING <-> WAITING_APPROVAL: the run waits when approvals are all it waits for."""
    if run.waiting_approvals <= 0:
        return
    # Read the status afresh: a failure earlier in this transaction may have ended the run.
    if Run.objects.values_list("status", flat=True).get(pk=run.pk) != RunStatus.RUNNING:
        return

    in_flight = Step.objects.filter(
        run=run,
        attempt_number=run.attempt_number,
        status__in=[StepStatus.RUNNING, StepStatus.PENDING],
        dispatched_at__isnull=False,
    ).exists()
    if not in_flight:
        updated = transition(
            Run, run.pk, RunStatus.WAITING_APPROVAL, message="waiting for approval"
        )
        run.status = updated.obj.status


# --------------------------------------------------------------------------- finishing
def finish_if_done(run: Run) -> None:
    """Complete the run once no agent is open (a plan can finish at pick-up: all skipped)."""
    if run.status == RunStatus.RUNNING and run.open_children == 0:
        services.run_complete(run_id=run.pk, actor="engine")


def step_finished(run: Run, step: Step, outbox: Outbox) -> None:
    """A step reached a terminal state: count it, release its dependents, finish its task."""
    task = Task.objects.get(pk=step.task_id)
    if step.handler_for_id is not None:
        _handler_finished(run, task, step, outbox)
        return
    _child_done(
        run,
        task,
        step,
        success=_counts_as_success(step),
        was_dispatched=step.dispatched_at is not None,
        outbox=outbox,
    )


def _counts_as_success(node: Agent | Task | Step) -> bool:
    if isinstance(node, Step):
        return node.status == StepStatus.COMPLETED or node.handled
    return node.status == NodeStatus.COMPLETED


def _child_done(
    run: Run,
    parent: Run | Agent | Task,
    child: Agent | Task | Step,
    *,
    success: bool,
    was_dispatched: bool,
    outbox: Outbox,
) -> None:
    """Bookkeeping shared by every level when ``child`` is finished for good."""
    active = 1 if was_dispatched else 0
    _row(parent).update(
        open_children=F("open_children") - 1, active_children=F("active_children") - active
    )
    parent.open_children -= 1
    parent.active_children -= active
    mode = parent.mode
    siblings = _children_of(parent)
    if child.dependents:
        if success or mode == Mode.SEQUENTIAL:
            # A sequential parent only orders its children; a dag edge needs a success.
            siblings.filter(name__in=child.dependents).update(
                pending_dependencies=F("pending_dependencies") - 1
            )
        else:
            _skip_dependents(run, parent, child, outbox)
    if parent.open_children == 0:
        _finish_parent(run, parent, outbox)
    else:
        _dispatch_children(run, parent, outbox)


def _children_of(parent: Run | Agent | Task) -> Any:
    """The parent's current children (this attempt, this generation, no handlers)."""
    if isinstance(parent, Run):
        return Agent.objects.filter(run=parent, attempt_number=parent.attempt_number)
    if isinstance(parent, Agent):
        return Task.objects.filter(agent=parent, generation=parent.retry_count)
    return Step.objects.filter(task=parent, generation=parent.retry_count, handler_for__isnull=True)


def _dispatch_children(run: Run, parent: Run | Agent | Task, outbox: Outbox) -> None:
    if isinstance(parent, Run):
        dispatch_agents(run, outbox)
    elif isinstance(parent, Agent):
        dispatch_tasks(run, parent, outbox)
    else:
        dispatch_steps(run, parent, outbox)
        update_waiting_state(run)


def _skip_dependents(
    run: Run, parent: Run | Agent | Task, child: Agent | Task | Step, outbox: Outbox
) -> None:
    """In a dag, work that needed an unsuccessful child is skipped, transitively."""
    siblings = _children_of(parent)
    frontier = list(child.dependents)
    skipped: list[Any] = []
    seen: set[str] = set()
    while frontier:
        names = [name for name in frontier if name not in seen]
        seen.update(names)
        rows = list(siblings.filter(name__in=names, status=NodeStatus.PENDING))
        if not rows:
            break
        message = f"skipped: dependency {child.name!r} did not complete"
        model = type(rows[0])
        changed = transition_many(
            model,
            model.objects.filter(pk__in=[row.pk for row in rows]),
            "skipped",
            from_states=["pending"],
            message=message,
            updates={
                "last_error" if model is not Step else "error": {
                    "code": "dependency_failed",
                    "message": message,
                }
            },
        )
        skipped.extend(changed)
        frontier = [name for row in changed for name in row.dependents]
    if skipped:
        _row(parent).update(open_children=F("open_children") - len(skipped))
        parent.open_children -= len(skipped)


def _finish_parent(run: Run, parent: Run | Agent | Task, outbox: Outbox) -> None:
    """Every child is finished: the parent completes (or is skipped if none succeeded)."""
    if isinstance(parent, Run):
        finish_if_done(run)
        return
    children = _children_of(parent)
    if isinstance(parent, Task):
        succeeded = (
            children.filter(status=StepStatus.COMPLETED).exists()
            or children.filter(handled=True).exists()
        )
    else:
        succeeded = children.filter(status=NodeStatus.COMPLETED).exists()
    status = NodeStatus.COMPLETED if succeeded else NodeStatus.SKIPPED
    finished = transition(_model(parent), parent.pk, status).obj
    _node_done(run, finished, outbox)


def _node_done(run: Run, node: Agent | Task, outbox: Outbox) -> None:
    """An agent or task finished (completed or skipped): tell its parent."""
    if isinstance(node, Task):
        agent = Agent.objects.get(pk=node.agent_id)
        _child_done(
            run, agent, node, success=_counts_as_success(node), was_dispatched=True, outbox=outbox
        )
    else:
        run.refresh_from_db(fields=["open_children", "active_children", "status"])
        _child_done(
            run, run, node, success=_counts_as_success(node), was_dispatched=True, outbox=outbox
        )


# --------------------------------------------------------------------------- failure
def child_failed(
    run: Run,
    parent: Run | Agent | Task,
    child: Agent | Task | Step,
    failure: Failure,
    outbox: Outbox,
) -> None:
    """``child`` failed for good; its parent reacts by its failure mode (seed 000 section 3).

    - continue: the child ends SKIPPED (its error kept) and the parent carries on;
    - retry: the parent starts over with a new generation of children (at most 3 times);
    - fail-fast: the parent fails at once and its parent reacts in turn.
    """
    mode = parent.failure_mode
    if mode == FailureMode.CONTINUE:
        _end_child(child, "skipped", failure)
        _child_done(
            run, parent, child, success=False, was_dispatched=_dispatched(child), outbox=outbox
        )
        return
    _end_child(child, "failed", failure)
    if isinstance(parent, Run):
        _run_failed(run, failure)
        return
    if mode == FailureMode.RETRY and parent.retry_count < MAX_LEVEL_RETRIES:
        _restart(run, parent, failure, outbox)
        return
    _fail_node(run, parent, failure, outbox)


def _dispatched(node: Agent | Task | Step) -> bool:
    return node.dispatched_at is not None


def _end_child(child: Agent | Task | Step, status: str, failure: Failure) -> None:
    if child.status in (
        NodeStatus.SKIPPED,
        NodeStatus.FAILED,
        NodeStatus.CANCELLED,
        NodeStatus.COMPLETED,
    ):
        return  # already terminal (a step that failed before its handlers ran)
    field = "error" if isinstance(child, Step) else "last_error"
    error = failure.as_error()
    if isinstance(child, Step) and child.error:
        error = {**child.error, **error}
    result = transition(
        _model(child),
        child.pk,
        status,
        message=failure.message,
        payload=error,
        updates={field: error},
    )
    child.status = result.obj.status


def _fail_node(run: Run, node: Agent | Task, failure: Failure, outbox: Outbox) -> None:
    """Fail an agent or task: its open children are cancelled, its parent is told."""
    _close_open_children(node, failure.message)
    node.refresh_from_db()
    if isinstance(node, Task):
        agent = Agent.objects.get(pk=node.agent_id)
        child_failed(run, agent, node, failure, outbox)
    else:
        run.refresh_from_db()
        child_failed(run, run, node, failure, outbox)


def _close_open_children(node: Agent | Task, message: str) -> None:
    """Cancel what is still open below ``node`` (running steps are terminated too)."""
    if isinstance(node, Agent):
        tasks = Task.objects.filter(agent=node)
        steps = Step.objects.filter(task__in=tasks)
    else:
        tasks = None
        steps = Step.objects.filter(task_id=node.pk)
    revoke_running_steps(steps)
    transition_many(Step, steps, StepStatus.CANCELLED, from_states=OPEN_STEP, message=message)
    if tasks is not None:
        transition_many(Task, tasks, NodeStatus.CANCELLED, from_states=NODE_OPEN, message=message)

    waiting = Step.objects.filter(
        run_id=node.run_id, attempt_number=node.attempt_number, status=StepStatus.WAITING_APPROVAL
    ).count()
    Run.objects.filter(pk=node.run_id).update(waiting_approvals=waiting)


def _restart(run: Run, node: Agent | Task, failure: Failure, outbox: Outbox) -> None:
    """Level retry: run the node's children again, from the start, as a new generation."""
    _close_open_children(node, f"restarting after: {failure.message}")
    plan = parse_plan(run.spec)
    generation = node.retry_count + 1
    if isinstance(node, Task):
        agent = Agent.objects.get(pk=node.agent_id)
        agent_plan = next(a for a in plan.agents if a.name == agent.name)
        task_plan = next(t for t in agent_plan.tasks if t.name == node.name)
        rows: Sequence[Any] = Step.objects.bulk_create(step_rows(run, node, task_plan, generation))
        counter = "step_count"
    else:
        agent_plan = next(a for a in plan.agents if a.name == node.name)
        rows = Task.objects.bulk_create(task_rows(run, node, agent_plan, generation))
        new_steps = [
            step
            for task, task_plan in zip(rows, agent_plan.tasks, strict=True)
            for step in step_rows(run, task, task_plan)
        ]
        Step.objects.bulk_create(new_steps, batch_size=1000)
        counter = "task_count"
    type(node).objects.filter(pk=node.pk).update(
        retry_count=generation,
        open_children=len(rows),
        active_children=0,
        **{counter: F(counter) + len(rows)},
    )
    record_event(
        run,
        EventKind.RETRY,
        entity=type(node).__name__.lower(),
        entity_id=str(node.pk),
        message=(
            f"{type(node).__name__.lower()} {node.name} retry {generation} "
            f"of {MAX_LEVEL_RETRIES}: {failure.message}"
        ),
        payload={"generation": generation, **failure.as_error()},
    )
    node.refresh_from_db()
    _dispatch_children(run, node, outbox)


def _run_failed(run: Run, failure: Failure) -> None:
    """An agent failed and the run does not continue: fail it, and retry it if it says so."""
    services.run_fail(run_id=run.pk, code=failure.code, message=failure.message, actor="engine")
    run.refresh_from_db()
    if (
        run.failure_mode == FailureMode.RETRY
        and run.automatic_retries < MAX_LEVEL_RETRIES
        and run.attempt_number < run.max_attempts
    ):
        try:
            with transaction.atomic():
                services.run_retry(run_id=run.pk, actor="engine")
                Run.objects.filter(pk=run.pk).update(automatic_retries=F("automatic_retries") + 1)
        except InsufficientCredits as exc:
            record_event(
                run, EventKind.ERROR, actor="engine", message=f"automatic retry refused: {exc}"
            )


def _handler_finished(run: Run, task: Task, handler: Step, outbox: Outbox) -> None:
    """An on_error handler ended: the original failure is handled, or it propagates."""
    Task.objects.filter(pk=task.pk).update(
        open_children=F("open_children") - 1, active_children=F("active_children") - 1
    )
    task.open_children -= 1
    task.active_children -= 1
    original = Step.objects.get(pk=handler.handler_for_id or 0)
    if handler.status == StepStatus.COMPLETED:
        if handler.dependents:
            Step.objects.filter(handler_for=original, name__in=handler.dependents).update(
                pending_dependencies=F("pending_dependencies") - 1
            )
            dispatch_steps(run, task, outbox)
            return
        Step.objects.filter(pk=original.pk).update(handled=True)
        original.handled = True
        record_event(
            run,
            EventKind.ERROR,
            entity="step",
            entity_id=str(original.pk),
            message=f"failure of {original.name} handled by on_error",
        )
        _child_done(run, task, original, success=True, was_dispatched=True, outbox=outbox)
        return
    transition_many(
        Step,
        Step.objects.filter(handler_for=original),
        StepStatus.SKIPPED,
        from_states=[StepStatus.PENDING],
        message="an earlier on_error handler failed",
    )
    left = Step.objects.filter(
        handler_for=original, status=StepStatus.SKIPPED, dispatched_at__isnull=True
    ).count()
    if left:
        Task.objects.filter(pk=task.pk).update(open_children=F("open_children") - left)
        task.open_children -= left
    error = original.error or {}
    child_failed(
        run,
        task,
        original,
        Failure(error.get("code", "tool_error"), error.get("message", "step failed")),
        outbox,
    )


def start_handlers(run: Run, task: Task, step: Step, outbox: Outbox) -> bool:
    """Create and dispatch the failed step's on_error handlers; False if it has none."""
    if not step.on_error or step.handler_for_id is not None:
        return False
    names = [handler["name"] for handler in step.on_error]
    wired = wiring(Mode.SEQUENTIAL, names, [[] for _ in names])
    first_position = step.position * 1000 + 1_000_000  # after every planned step
    rows = []
    for index, spec in enumerate(step.on_error):
        handler = step_row(
            run,
            task,
            StepPlan(
                name=f"{step.name}.on_error.{spec['name']}",
                tool=spec["tool"],
                params=spec.get("params", {}),
                when=spec.get("when", ""),
                retry=RetryPolicy.from_dict(spec.get("retry", {})),
                timeout_ms=spec.get("timeout_ms"),
                depends_on=(),
                on_error=(),
            ),
            first_position + index,
            (wired[index][0], [f"{step.name}.on_error.{n}" for n in wired[index][1]]),
            step.generation,
        )
        handler.handler_for = step
        rows.append(handler)
    Step.objects.bulk_create(rows)
    Task.objects.filter(pk=task.pk).update(
        step_count=F("step_count") + len(rows), open_children=F("open_children") + len(rows)
    )
    task.open_children += len(rows)
    first = rows[0]
    Step.objects.filter(pk=first.pk).update(dispatched_at=timezone.now())
    Task.objects.filter(pk=task.pk).update(active_children=F("active_children") + 1)
    task.active_children += 1
    outbox.add(StepMessage(first.pk, run.priority, step_timeout_s(first)))
    record_event(
        run,
        EventKind.ERROR,
        entity="step",
        entity_id=str(step.pk),
        message=f"running {len(rows)} on_error handler(s) for {step.name}",
    )
    return True


# --------------------------------------------------------------------------- steps
def charge_step(run: Run, step: Step, cost: Decimal) -> Failure | None:
    """Charge a finished step attempt; a charge beyond the reservation is a failure."""
    try:
        credits_charge(
            # Identified by run and number: no need to read the attempt row first.
            organization_id=run.organization_id,
            run_id=run.pk,
            attempt_number=step.attempt_number,
            step_id=step.pk,
            step_attempt=step.attempts,
            amount=cost,
            reason=f"step {step.name} attempt {step.attempts}",
            actor="engine",
        )
    except BudgetExhausted as exc:
        return Failure("budget_exhausted", str(exc))
    return None


def step_failed(run: Run, step: Step, failure: Failure, outbox: Outbox) -> None:
    """A running step failed for good (retries exhausted or not retryable).

    With on_error handlers it ends FAILED while they run; otherwise its task reacts by
    its failure mode (``child_failed``). A failing handler settles its original step.
    """
    task = Task.objects.get(pk=step.task_id)
    if step.handler_for_id is not None:
        _end_child(step, "failed", failure)
        _handler_finished(run, task, step, outbox)
    elif step.on_error:
        _end_child(step, "failed", failure)
        start_handlers(run, task, step, outbox)
    else:
        child_failed(run, task, step, failure, outbox)


# --------------------------------------------------------------------------- control
def resume(run_id: Any, actor: str = "worker") -> bool:
    """RESUMING -> RUNNING: re-dispatch what the pause held, then carry on.

    Agents and tasks that were already under way go back to RUNNING; their dispatched
    steps whose messages were dropped while paused are published again (a duplicate
    of a message still queued is harmless: the claim lets one through).
    """
    with transaction.atomic():
        run = services.lock_run(run_id, light=True)
        if run.status != RunStatus.RESUMING:
            return False
        now = timezone.now()
        for model in (Agent, Task):
            transition_many(
                model,  # type: ignore[type-var]
                model.objects.filter(
                    run=run,
                    attempt_number=run.attempt_number,
                    status=NodeStatus.PENDING,
                    dispatched_at__isnull=False,
                ),
                NodeStatus.RUNNING,
                from_states=[NodeStatus.PENDING],
                actor=actor,
                now=now,
            )
        run = services.run_resumed(run_id=run.pk, actor=actor)
        outbox = Outbox()
        held = Step.objects.filter(
            run=run,
            attempt_number=run.attempt_number,
            status=StepStatus.PENDING,
            dispatched_at__isnull=False,
        ).only("pk", "timeout_ms")
        for step in held:
            outbox.add(StepMessage(step.pk, run.priority, step_timeout_s(step)))
        dispatch_agents(run, outbox)
        for agent in Agent.objects.filter(
            run=run, attempt_number=run.attempt_number, status=NodeStatus.RUNNING
        ):
            dispatch_tasks(run, agent, outbox)
        for task in Task.objects.filter(
            run=run, attempt_number=run.attempt_number, status=NodeStatus.RUNNING
        ):
            dispatch_steps(run, task, outbox)
        update_waiting_state(run)
        # Everything may have finished during the pause: then nothing is left to run.
        finish_if_done(run)
        return True


def node_timed_out(run: Run, node: Agent | Task, code: str, message: str) -> None:
    """An agent or task ran past its timeout: it fails, and its parent reacts."""
    _fail_node(run, node, Failure(code, message), Outbox())
