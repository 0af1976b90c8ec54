"""A fork: a new run from a terminal one, which takes what came before a step as done.

``run_fork`` creates a run of the source's plan (or an edited one, with other variables)
whose first attempt reuses, as a retry with ``reuse`` does (``runs.reuse``), the steps
the source's last attempt completed before ``from``: earlier in a sequence, or not
downstream of it in a dag, at any level. ``from`` and everything downstream of it run.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from django.db import transaction

from billing.models import Organization
from billing.services import to_credits
from common.expressions import parsed
from common.templates import Template
from runs import catalogue, services
from runs.materialize import wiring
from runs.models import EventKind, Run
from runs.plan import Plan, StepPlan, parse_plan
from runs.plan.errors import a
from runs.reservation import plan_reservation
from runs.reuse import completed_steps, step_path
from runs.states import RUN_TERMINAL, InvalidTransition
from runs.transitions import record_event

_ABSENT = object()


class InvalidFork(Exception):
    """The fork cannot take what it would reuse: ``paths`` are the steps at fault."""

    code = "invalid_fork"

    def __init__(self, message: str, paths: Sequence[str]) -> None:
        super().__init__(message)
        self.paths = list(paths)


@dataclass(frozen=True)
class Fork:
    """What a fork takes and runs: the steps reused (by path, with their source), the
    steps that run, and what its start reserves."""

    plan: dict[str, Any]
    reuse: dict[str, dict[str, Any]]
    run: list[str]
    reservation: Decimal
    # ``plan`` parsed and checked against the organization's tools: the fork's run is
    # created from it (``run_fork``), and started from it, without reading it again.
    parsed: Plan


def _reached(
    mode: str, names: Sequence[str], depends_on: Sequence[Sequence[str]], start: str
) -> set[str]:
    """``start`` and the siblings that wait for it, directly or not."""
    wired = dict(zip(names, wiring(mode, names, depends_on), strict=True))
    reached, todo = {start}, deque([start])
    while todo:
        for name in wired[todo.popleft()][1]:
            if name not in reached:
                reached.add(name)
                todo.append(name)
    return reached


def downstream(plan: Plan, from_path: str) -> set[str] | None:
    """The paths of the steps that run again in a fork from ``from_path``: it and what
    waits for it in its task, the tasks of its agent that wait for its task, the agents
    that wait for its agent. None when the plan has no such step."""
    parts = from_path.split(".")
    if len(parts) != 3:
        return None
    agent_name, task_name, step_name = parts
    agent = next((a for a in plan.agents if a.name == agent_name), None)
    task = next((t for t in agent.tasks if t.name == task_name), None) if agent else None
    if agent is None or task is None or all(s.name != step_name for s in task.steps):
        return None
    steps = _reached(
        task.mode, [s.name for s in task.steps], [s.depends_on for s in task.steps], step_name
    )
    found = {step_path(agent.name, task.name, name) for name in steps}
    tasks = _reached(
        agent.mode, [t.name for t in agent.tasks], [t.depends_on for t in agent.tasks], task_name
    ) - {task_name}
    found.update(
        step_path(agent.name, t.name, s.name)
        for t in agent.tasks
        if t.name in tasks
        for s in t.steps
    )
    agents = _reached(
        plan.mode, [a.name for a in plan.agents], [a.depends_on for a in plan.agents], agent_name
    ) - {agent_name}
    found.update(
        step_path(a.name, t.name, s.name)
        for a in plan.agents
        if a.name in agents
        for t in a.tasks
        for s in t.steps
    )
    return found


def _steps(plan: Plan) -> dict[str, StepPlan]:
    return {
        step_path(a.name, t.name, s.name): s for a in plan.agents for t in a.tasks for s in t.steps
    }


def _same(old: StepPlan, new: StepPlan) -> bool:
    return (old.tool, old.params, old.depends_on) == (new.tool, new.params, new.depends_on)


def _texts(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _texts(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _texts(item)


def _reads(step: StepPlan, variables: set[str]) -> bool:
    """Whether the step's parameters or condition read one of ``variables`` (or all of
    them): its output came from values the fork changes."""
    references = [ref for text in _texts(step.params) for ref in Template.parse(text).references]
    if step.when:
        references += parsed(step.when).references
    return any(
        ref[0] == "variables" and (len(ref) == 1 or ref[1] in variables) for ref in references
    )


def fork_of(
    source: Run, from_path: str, plan: dict[str, Any] | None, variables: dict[str, Any] | None
) -> Fork:
    """What a fork of ``source`` from ``from_path`` would be (nothing written). With
    ``plan``, every step it would reuse must be unchanged there (same path, tool, params
    and dependencies); ``variables`` are laid over the plan's, and a step it would reuse
    must not read one whose value changes."""
    if plan is not None and not isinstance(plan, dict):
        raise InvalidFork(
            f"plan must be an object (a run's plan; left out, the source's), got {a(plan)}",
            [],
        )
    if source.status not in RUN_TERMINAL:
        raise InvalidTransition("run", source.status, "forked", "only an ended run can be forked")
    raw = dict(plan if plan is not None else source.plan)
    # Plan variables that are not an object are parse_plan's to refuse, with their path.
    if variables is not None and isinstance(raw.get("variables", {}), dict):
        raw["variables"] = {**raw.get("variables", {}), **variables}
    new = parse_plan(raw, tools=catalogue.OrganizationCatalogue(source.organization_id))
    again = downstream(new, from_path)
    if again is None:
        raise InvalidFork(f"the plan has no step {from_path!r} (agent.task.step)", [from_path])
    done = completed_steps(source, source.attempt_number)
    old_steps, new_steps = _steps(services.plan_of(source)), _steps(new)
    reuse = {path: found for path, found in done.items() if path not in again}
    old_variables = source.variables or {}
    moved = {
        name
        for name in {*old_variables, *new.variables}
        if old_variables.get(name, _ABSENT) != new.variables.get(name, _ABSENT)
    }
    changed = [
        path
        for path in reuse
        if path not in new_steps
        or path not in old_steps
        or not _same(old_steps[path], new_steps[path])
        or (moved and _reads(new_steps[path], moved))
    ]
    if changed:
        raise InvalidFork(
            f"the steps before {from_path!r} it would reuse must be unchanged in the plan: "
            + ", ".join(sorted(changed)),
            sorted(changed),
        )
    runs = [path for path in new_steps if path not in reuse]
    return Fork(raw, reuse, runs, to_credits(plan_reservation(new, reuse)), new)


def fork_preview(
    *,
    run_id: Any,
    organization: Organization,
    from_path: str,
    plan: dict[str, Any] | None = None,
    variables: dict[str, Any] | None = None,
) -> Fork:
    """What ``run_fork`` would do (a dry run): nothing locked, nothing written."""
    source = Run.objects.filter(pk=run_id, organization=organization).first()
    if source is None:
        raise services.RunNotFound(f"run {run_id} not found")
    return fork_of(source, from_path, plan, variables)


@transaction.atomic
def run_fork(
    *,
    run_id: Any,
    organization: Organization,
    from_path: str,
    plan: dict[str, Any] | None = None,
    variables: dict[str, Any] | None = None,
    actor: str = "system",
) -> services.Created:
    """Create (CREATED, not started) the fork of a terminal run from ``from_path``; the
    source lists it (``Run.forks``) and both runs record the fork in their history. With
    its plan as the fork checked it, for a start in the same transaction (``run_start``'s
    ``plan``)."""
    source = services.lock_run(run_id, organization)
    fork = fork_of(source, from_path, plan, variables)
    created = services.run_create_checked(
        organization=organization, plan=fork.plan, actor=actor, parsed=fork.parsed
    )
    run = created.run
    Run.objects.filter(pk=run.pk).update(
        reuse=fork.reuse, forked_from_run=source, forked_from_step=from_path
    )
    run.reuse, run.forked_from_run_id, run.forked_from_step = fork.reuse, source.pk, from_path
    forked = {"run": str(source.pk), "step": from_path}
    record_event(
        run,
        EventKind.REUSE,
        actor=actor,
        message=f"forked from run {source.pk} at {from_path}: {len(fork.reuse)} steps reused",
        payload={"forked_from": forked, "reused_steps": len(fork.reuse)},
    )
    record_event(
        source,
        EventKind.REUSE,
        actor=actor,
        message=f"forked at {from_path} as run {run.pk}",
        payload={"fork": str(run.pk), "step": from_path},
    )
    return created
