"""Failure modes: a child failed for good, and its parent reacts as its plan's
`failure_mode` says: continue, retry the level, or fail fast up the tree."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.db.models import F

from billing.services import InsufficientCredits
from runs import services
from runs.engine.dispatch import dispatch_children
from runs.engine.policy import consider_replan
from runs.engine.propagation import child_done
from runs.engine.tree import MAX_LEVEL_RETRIES, model_of
from runs.materialize import step_rows, task_rows
from runs.models import Agent, EventKind, FailureMode, Run, Step, Task
from runs.outbox import Outbox, revoke_running_steps
from runs.states import NODE_OPEN, STEP_OPEN, NodeStatus, RunStatus, StepStatus
from runs.transitions import record_event, transition, transition_many


@dataclass(frozen=True)
class Failure:
    code: str
    message: str

    def as_error(self, **extra: Any) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, **extra}


def child_failed(
    run: Run,
    parent: Run | Agent | Task,
    child: Agent | Task | Step,
    failure: Failure,
    outbox: Outbox,
) -> None:
    """``child`` failed for good; its parent reacts by its failure mode.

    - continue: the child ends SKIPPED (its error kept) and the parent carries on;
    - retry: the parent starts over with a new generation of children (at most 3 times);
    - fail-fast: the parent fails at once and its parent reacts in turn.
    """
    if isinstance(child, Agent | Task):
        # Before the parent reacts: a re-plan asked for holds the run open, so the
        # failing child cannot be the end of it (runs.engine.policy).
        consider_replan(run, parent, child, failure.as_error())
    mode = parent.failure_mode
    if mode == FailureMode.CONTINUE:
        end_child(child, "skipped", failure)
        child_done(run, child, outbox)
        return
    end_child(child, "failed", failure)
    if isinstance(parent, Run):
        _run_failed(run, failure)
        return
    if mode == FailureMode.RETRY and parent.retry_count < MAX_LEVEL_RETRIES:
        _restart(run, parent, failure, outbox)
        return
    fail_node(run, parent, failure, outbox)


def end_child(child: Agent | Task | Step, status: str, failure: Failure) -> None:
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
        model_of(child),
        child.pk,
        status,
        message=failure.message,
        payload=error,
        updates={field: error},
    )
    child.status = result.obj.status


def fail_node(run: Run, node: Agent | Task, failure: Failure, outbox: Outbox) -> None:
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
    transition_many(Step, steps, StepStatus.CANCELLED, from_states=STEP_OPEN, message=message)
    if tasks is not None:
        transition_many(Task, tasks, NodeStatus.CANCELLED, from_states=NODE_OPEN, message=message)

    waiting = Step.objects.filter(
        run_id=node.run_id, attempt_number=node.attempt_number, status=StepStatus.WAITING_APPROVAL
    ).count()
    Run.objects.filter(pk=node.run_id).update(waiting_approvals=waiting)


def _restart(run: Run, node: Agent | Task, failure: Failure, outbox: Outbox) -> None:
    """Level retry: run the node's children again, from the start, as a new generation."""
    _close_open_children(node, f"restarting after: {failure.message}")
    # A re-plan's agents are not in the plan as submitted: the attempt's plan has them.
    plan = services.replanned_plan(
        Run.objects.only("plan", "replan_count", "attempt_number").get(pk=run.pk)
    )
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
    dispatch_children(run, node, outbox)


def _run_failed(run: Run, failure: Failure) -> None:
    """An agent failed and the run does not continue: fail it, and retry it if it says so.

    A run paused (or on its way back from a pause) ends only by its client's hand: the
    failure is held, the agent left FAILED, and the resume ends the run as it says
    (``held_failure``, ``runs.engine.control.resume``). Failing it here let its
    automatic retry start a new attempt the client never resumed, and refused the
    client's resume."""
    run.refresh_from_db(fields=["status"])
    if run.status in (RunStatus.PAUSED, RunStatus.RESUMING):
        record_event(
            run,
            EventKind.ERROR,
            actor="engine",
            message=f"the run fails at its resume: {failure.message}",
            payload={**failure.as_error(), "held": True},
        )
        return
    run_failed(run, failure)


def held_failure(run: Run) -> Failure | None:
    """The failure a pause held (``_run_failed``): the first agent of the attempt that
    failed for good, or None. Only a held failure leaves a FAILED agent in an open run:
    otherwise the run fails with it, or its failure mode `continue` skips it."""
    error = (
        Agent.objects.filter(run=run, attempt_number=run.attempt_number, status=NodeStatus.FAILED)
        .order_by("status_changed_at", "position")
        .values_list("last_error", flat=True)
        .first()
    )
    if error is None:
        return None
    return Failure(error.get("code", "agent_failed"), error.get("message", "an agent failed"))


def run_failed(run: Run, failure: Failure) -> None:
    """Fail the run with ``failure``, and start its next attempt if its plan says so."""
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
            # An abort of its own: the run stays FAILED, and says why it was
            # not tried again, with the failure that ended the attempt as its cause.
            error = {
                "code": "insufficient_credits",
                "message": f"the next attempt was not started: {exc}",
                "cause": failure.as_error(),
            }
            Run.objects.filter(pk=run.pk).update(last_error=error)
            record_event(
                run,
                EventKind.ERROR,
                actor="engine",
                message=f"automatic retry refused: {exc}",
                payload=error,
            )


def supersede(run: Run, agent: Agent, message: str, outbox: Outbox) -> None:
    """A re-plan replaces ``agent`` (runs.people.escalations): its open work is cancelled (running
    steps terminated) and it ends SKIPPED with `replanned`, counted as a child that did
    not complete. Its failure is not propagated: what replaces it is on its way."""
    _close_open_children(agent, message)
    error = {"code": "replanned", "message": message}
    ended = transition(
        Agent,
        agent.pk,
        NodeStatus.SKIPPED,
        message=message,
        payload=error,
        updates={"last_error": error},
    ).obj
    run.refresh_from_db(fields=["open_children", "active_children", "status"])
    child_done(run, ended, outbox)


def node_timed_out(run: Run, node: Agent | Task, code: str, message: str) -> None:
    """An agent or task ran past its timeout: it fails, and its parent reacts."""
    fail_node(run, node, Failure(code, message), Outbox())
