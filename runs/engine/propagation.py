"""Propagation: a child finished for good; its parent counts it, releases its dependents,
and finishes when it was the last, which a level up is the same again."""

from __future__ import annotations

from typing import Any

from django.db.models import F

from runs import services
from runs.engine.dispatch import dispatch_children
from runs.engine.tree import children_of, counts_as_success, model_of, row_of
from runs.models import Agent, Mode, Run, Step, Task
from runs.outbox import Outbox
from runs.states import NodeStatus, RunStatus, StepStatus
from runs.transitions import transition, transition_many


def finish_if_done(run: Run) -> None:
    """Complete the run once no agent is open (a plan can finish at pick-up: all skipped)."""
    if run.status == RunStatus.RUNNING and run.open_children == 0:
        services.run_complete(run_id=run.pk, actor="engine")


def child_done(
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
    row_of(parent).update(
        open_children=F("open_children") - 1, active_children=F("active_children") - active
    )
    parent.open_children -= 1
    parent.active_children -= active
    mode = parent.mode
    siblings = children_of(parent)
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
        dispatch_children(run, parent, outbox)


def _skip_dependents(
    run: Run, parent: Run | Agent | Task, child: Agent | Task | Step, outbox: Outbox
) -> None:
    """In a dag, work that needed an unsuccessful child is skipped, transitively."""
    siblings = children_of(parent)
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
        row_of(parent).update(open_children=F("open_children") - len(skipped))
        parent.open_children -= len(skipped)


def _finish_parent(run: Run, parent: Run | Agent | Task, outbox: Outbox) -> None:
    """Every child is finished: the parent completes (or is skipped if none succeeded)."""
    if isinstance(parent, Run):
        finish_if_done(run)
        return
    children = children_of(parent)
    if isinstance(parent, Task):
        succeeded = (
            children.filter(status=StepStatus.COMPLETED).exists()
            or children.filter(handled=True).exists()
        )
    else:
        succeeded = children.filter(status=NodeStatus.COMPLETED).exists()
    status = NodeStatus.COMPLETED if succeeded else NodeStatus.SKIPPED
    finished = transition(model_of(parent), parent.pk, status).obj
    _node_done(run, finished, outbox)


def _node_done(run: Run, node: Agent | Task, outbox: Outbox) -> None:
    """An agent or task finished (completed or skipped): tell its parent."""
    if isinstance(node, Task):
        agent = Agent.objects.get(pk=node.agent_id)
        child_done(
            run, agent, node, success=counts_as_success(node), was_dispatched=True, outbox=outbox
        )
    else:
        run.refresh_from_db(fields=["open_children", "active_children", "status"])
        child_done(
            run, run, node, success=counts_as_success(node), was_dispatched=True, outbox=outbox
        )
