"""Turn a run's plan into Agent, Task and Step rows for one attempt.

Runs carry no agents until a worker picks them up (a PENDING run has
agent_count = 0); ``run_pick_up`` calls ``materialize``, which moves the run to RUNNING
with its rows (a start that begins its run at once calls it too). Python works out the
new rows' values from the typed plan and one engine function writes them
(``runs.run_pick_up``): a small run's pick-up is one statement, a 20,000-step plan's
ten.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from itertools import islice
from typing import Any

from django.db import connection
from django.db.models import F
from django.utils import timezone

from runs.models import Agent, Mode, Run, RunAttempt, Step, Task
from runs.plan import AgentPlan, HandlerPlan, Plan, StepPlan, TaskPlan

# Steps written per statement: a wide plan's go in batches, never a statement of all of
# them (a run may hold 20,000; the batch's JSON is what the worker holds at once).
STEPS_PER_STATEMENT = 2000


def wiring(
    mode: str, names: Sequence[str], depends_on: Sequence[Sequence[str]]
) -> list[tuple[int, list[str]]]:
    """(pending dependency count, dependents) of each child of a parent run in ``mode``.

    One scheme covers the three modes: a sequential parent is a chain in which each
    child waits for the one before; a parallel parent has no edges; a dag has its own.
    """
    if mode == "sequential":
        return [
            (0 if index == 0 else 1, [names[index + 1]] if index + 1 < len(names) else [])
            for index in range(len(names))
        ]
    if mode == "parallel":
        return [(0, []) for _ in names]
    dependents: dict[str, list[str]] = {name: [] for name in names}
    for name, deps in zip(names, depends_on, strict=True):
        for dep in deps:
            dependents[dep].append(name)
    return [(len(deps), dependents[name]) for name, deps in zip(names, depends_on, strict=True)]


def agent_values(plan: AgentPlan, position: int, wired: tuple[int, list[str]]) -> dict[str, Any]:
    """A new agent's columns that its plan and place decide (the rest, what every new
    agent starts with, ``runs.attempt_materialize`` sets)."""
    return {
        "name": plan.name,
        "position": position,
        "mode": plan.mode,
        "failure_mode": plan.failure_mode,
        "max_concurrent_tasks": plan.max_concurrent_tasks,
        "depends_on": list(plan.depends_on),
        "pending_dependencies": wired[0],
        "dependents": wired[1],
        "task_count": len(plan.tasks),
        "timeout_ms": plan.timeout_ms,
    }


def task_values(
    plan: TaskPlan, position: int, wired: tuple[int, list[str]], generation: int = 0
) -> dict[str, Any]:
    """A new task's columns that its plan and place decide (``agent_values``)."""
    return {
        "name": plan.name,
        "position": position,
        "generation": generation,
        "mode": plan.mode,
        "failure_mode": plan.failure_mode,
        "max_concurrent_steps": plan.max_concurrent_steps,
        "depends_on": list(plan.depends_on),
        "pending_dependencies": wired[0],
        "dependents": wired[1],
        "step_count": len(plan.steps),
        "timeout_ms": plan.timeout_ms,
    }


def step_values(
    plan: StepPlan,
    position: int,
    wired: tuple[int, list[str]],
    generation: int = 0,
    reused_from: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A new step's columns that its plan and place decide (``agent_values``;
    ``runs.steps_insert`` sets the rest)."""
    return {
        "name": plan.name,
        "position": position,
        "generation": generation,
        "tool": plan.tool,
        "params": plan.params,
        "when": plan.when,
        "on_error": [handler.stored() for handler in plan.on_error],
        "on_callback": [handler.stored() for handler in plan.on_callback],
        "retry": plan.retry.as_dict(),
        "timeout_ms": plan.timeout_ms,
        "rate_limits": plan.rate_limits_stored(),
        "depends_on": list(plan.depends_on),
        "pending_dependencies": wired[0],
        "dependents": wired[1],
        "reused_from": reused_from,
        "cache": plan.cache.stored() if plan.cache is not None else None,
    }


def task_row(
    run: Run,
    agent: Agent,
    plan: TaskPlan,
    position: int,
    wired: tuple[int, list[str]],
    generation: int = 0,
) -> Task:
    """``task_values`` as an unsaved Task (a level retry's new generation)."""
    values = task_values(plan, position, wired, generation)
    return Task(
        run=run,
        agent=agent,
        attempt_number=agent.attempt_number,
        open_children=values["step_count"],
        **values,
    )


def step_row(
    run: Run,
    task: Task,
    plan: StepPlan,
    position: int,
    wired: tuple[int, list[str]],
    generation: int = 0,
) -> Step:
    """``step_values`` as an unsaved Step (a level retry's new generation, handlers)."""
    return Step(
        run=run,
        task=task,
        attempt_number=task.attempt_number,
        **step_values(plan, position, wired, generation),
    )


def add_handler_rows(
    run: Run, task: Task, step: Step, kind: str, first_position: int, held: int = 0
) -> list[Step]:
    """Create ``step``'s ``kind`` handlers (on_error, on_callback) in its task, in
    sequence, named ``<step>.<kind>.<handler>``; the first waits for ``held`` more
    dependencies. The task counts them as open children."""
    specs = list(getattr(step, kind))
    names = [f"{step.name}.{kind}.{spec['name']}" for spec in specs]
    wired = wiring(Mode.SEQUENTIAL, names, [[] for _ in names])
    rows = []
    for index, spec in enumerate(specs):
        row = step_row(
            run,
            task,
            HandlerPlan.from_stored(spec, name=names[index]),
            first_position + index,
            (wired[index][0] + (held if index == 0 else 0), wired[index][1]),
            step.generation,
        )
        if kind == "on_error":
            row.handler_for = step
        else:
            row.callback_for = step
        rows.append(row)
    Step.objects.bulk_create(rows)
    Task.objects.filter(pk=task.pk).update(
        step_count=F("step_count") + len(rows), open_children=F("open_children") + len(rows)
    )
    task.open_children += len(rows)
    return rows


def wire_children(
    mode: str, children: Sequence[AgentPlan | TaskPlan | StepPlan]
) -> list[tuple[int, list[str]]]:
    return wiring(mode, [c.name for c in children], [c.depends_on for c in children])


def task_rows(run: Run, agent: Agent, plan: AgentPlan, generation: int = 0) -> list[Task]:
    wired = wire_children(plan.mode, plan.tasks)
    return [
        task_row(run, agent, task_plan, index, wired[index], generation)
        for index, task_plan in enumerate(plan.tasks)
    ]


def step_rows(run: Run, task: Task, plan: TaskPlan, generation: int = 0) -> list[Step]:
    wired = wire_children(plan.mode, plan.steps)
    return [
        step_row(run, task, step_plan, index, wired[index], generation)
        for index, step_plan in enumerate(plan.steps)
    ]


def materialize(run: Run, attempt: RunAttempt, plan: Plan, *, actor: str, now: datetime) -> int:
    """The attempt's rows, and the run PENDING -> RUNNING with them (``runs.run_pick_up``:
    its caller holds the run locked and has seen it PENDING); the steps ``Run.reuse``
    names complete with their earlier output when they come to run, without running
    (docs/engine.md). Returns how many agents it has."""
    wired = wire_children(plan.mode, plan.agents)
    return _write(run, attempt, plan.agents, wired, 0, run.reuse, now, _PICK_UP_SQL, [actor, now])


def add_agents(
    run: Run,
    attempt: RunAttempt,
    plans: Sequence[AgentPlan],
    wired: Sequence[tuple[int, list[str]]],
    first_position: int,
) -> int:
    """Add ``plans``' agents (wired as given), their tasks and their steps to the running
    attempt, positioned from ``first_position`` (a re-plan adds agents after the rest);
    returns how many."""
    now = timezone.now()
    return _write(run, attempt, plans, wired, first_position, None, now, _ADD_SQL, [now])


_PICK_UP_SQL = "SELECT runs.run_pick_up(%s, %s, %s, %s, %s, %s, %s, %s)"
_ADD_SQL = "SELECT runs.attempt_materialize(%s, %s, %s, %s, %s, %s, %s)"


def _write(
    run: Run,
    attempt: RunAttempt,
    plans: Sequence[AgentPlan],
    wired: Sequence[tuple[int, list[str]]],
    first_position: int,
    reuse: Mapping[str, dict[str, Any]] | None,
    now: datetime,
    statement: str,
    extra: list[Any],
) -> int:
    """Write ``plans``' rows from their values with ``statement`` (``runs.run_pick_up``
    or ``runs.attempt_materialize``, ``extra`` its arguments after the rows): the
    agents, the tasks and the first STEPS_PER_STATEMENT steps, then the rest of a wide
    plan's steps in batches (``runs.steps_insert``)."""
    agents: list[dict[str, Any]] = []
    tasks: list[dict[str, Any]] = []
    for index, agent_plan in enumerate(plans):
        position = first_position + index
        agents.append(agent_values(agent_plan, position, wired[index]))
        tasks.extend(
            {"agent": position, **task_values(task_plan, task_index, task_wired)}
            for task_index, (task_plan, task_wired) in enumerate(
                zip(agent_plan.tasks, wire_children(agent_plan.mode, agent_plan.tasks), strict=True)
            )
        )
    steps = _steps(plans, reuse)
    first = list(islice(steps, STEPS_PER_STATEMENT))
    rows: list[Any] = [
        run.pk,
        attempt.pk,
        attempt.attempt_number,
        _json(agents),
        _json(tasks),
        _json(first),
    ]
    with connection.cursor() as cursor:
        cursor.execute(statement, [*rows, *extra])
        task_ids = cursor.fetchone()[0]
        while batch := list(islice(steps, STEPS_PER_STATEMENT)):
            cursor.execute(
                "SELECT runs.steps_insert(%s, %s, %s, %s, %s)",
                [run.pk, attempt.attempt_number, task_ids, _json(batch), now],
            )
    return len(agents)


def _steps(
    plans: Sequence[AgentPlan], reuse: Mapping[str, dict[str, Any]] | None
) -> Iterator[dict[str, Any]]:
    """The steps' values of ``plans``' tasks, each naming its task by index in the order
    ``_write`` lists the tasks; produced as they are sent."""
    task_index = 0
    for agent_plan in plans:
        for task_plan in agent_plan.tasks:
            prefix = f"{agent_plan.name}.{task_plan.name}."
            wired = wire_children(task_plan.mode, task_plan.steps)
            for index, step_plan in enumerate(task_plan.steps):
                reused = reuse.get(prefix + step_plan.name) if reuse else None
                yield {"task": task_index, **step_values(step_plan, index, wired[index], 0, reused)}
            task_index += 1


def _json(rows: list[dict[str, Any]]) -> str:
    return json.dumps(rows, separators=(",", ":"))
