"""Turn a run's plan into Agent, Task and Step rows for one attempt.

Runs carry no agents until a worker picks them up (seed 000: PENDING has
agent_count = 0); ``run_pick_up`` calls ``materialize`` in the transaction that moves the
run to RUNNING. Rows are bulk-inserted: a 5,000-step plan is a handful of statements.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from django.db.models import F

from common.copy import copy_insert
from runs.models import Agent, Mode, Run, RunAttempt, Step, Task
from runs.plan import AgentPlan, HandlerPlan, Plan, StepPlan, TaskPlan


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


def _agent_row(
    run: Run, attempt: RunAttempt, plan: AgentPlan, position: int, wired: tuple[int, list[str]]
) -> Agent:
    return Agent(
        run=run,
        attempt=attempt,
        attempt_number=attempt.attempt_number,
        name=plan.name,
        position=position,
        mode=plan.mode,
        failure_mode=plan.failure_mode,
        max_concurrent_tasks=plan.max_concurrent_tasks,
        depends_on=list(plan.depends_on),
        pending_dependencies=wired[0],
        dependents=wired[1],
        task_count=len(plan.tasks),
        open_children=len(plan.tasks),
        timeout_ms=plan.timeout_ms,
    )


def task_row(
    run: Run,
    agent: Agent,
    plan: TaskPlan,
    position: int,
    wired: tuple[int, list[str]],
    generation: int = 0,
) -> Task:
    return Task(
        run=run,
        agent=agent,
        attempt_number=agent.attempt_number,
        name=plan.name,
        position=position,
        generation=generation,
        mode=plan.mode,
        failure_mode=plan.failure_mode,
        max_concurrent_steps=plan.max_concurrent_steps,
        depends_on=list(plan.depends_on),
        pending_dependencies=wired[0],
        dependents=wired[1],
        step_count=len(plan.steps),
        open_children=len(plan.steps),
        timeout_ms=plan.timeout_ms,
    )


def step_row(
    run: Run,
    task: Task,
    plan: StepPlan,
    position: int,
    wired: tuple[int, list[str]],
    generation: int = 0,
    reused_from: dict[str, Any] | None = None,
) -> Step:
    return Step(
        run=run,
        task=task,
        attempt_number=task.attempt_number,
        name=plan.name,
        position=position,
        generation=generation,
        tool=plan.tool,
        params=plan.params,
        when=plan.when,
        on_error=[handler.stored() for handler in plan.on_error],
        on_callback=[handler.stored() for handler in plan.on_callback],
        retry=plan.retry.as_dict(),
        timeout_ms=plan.timeout_ms,
        rate_limits=plan.rate_limits_stored(),
        depends_on=list(plan.depends_on),
        pending_dependencies=wired[0],
        dependents=wired[1],
        reused_from=reused_from,
        cache=plan.cache.stored() if plan.cache is not None else None,
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


def step_rows(
    run: Run,
    task: Task,
    plan: TaskPlan,
    generation: int = 0,
    reuse: Mapping[str, dict[str, Any]] | None = None,
) -> list[Step]:
    """The task's steps; ``reuse``: the run's steps (by path) that take an earlier step's
    output instead of running (``Run.reuse``, runs.reuse)."""
    wired = wire_children(plan.mode, plan.steps)
    prefix = f"{task.agent.name}.{task.name}." if reuse else ""
    return [
        step_row(
            run,
            task,
            step_plan,
            index,
            wired[index],
            generation,
            reuse.get(prefix + step_plan.name) if reuse else None,
        )
        for index, step_plan in enumerate(plan.steps)
    ]


def materialize(run: Run, attempt: RunAttempt, plan: Plan) -> list[Agent]:
    """The attempt's rows; the steps ``Run.reuse`` names complete with their earlier
    output when they come to run, without running (docs/engine.md)."""
    wired = wire_children(plan.mode, plan.agents)
    return add_agents(run, attempt, plan.agents, wired, reuse=run.reuse)


def add_agents(
    run: Run,
    attempt: RunAttempt,
    plans: Sequence[AgentPlan],
    wired: Sequence[tuple[int, list[str]]],
    first_position: int = 0,
    reuse: Mapping[str, dict[str, Any]] | None = None,
) -> list[Agent]:
    """Create ``plans``' agents (wired as given), their tasks and their steps in the
    attempt, positioned from ``first_position`` (a re-plan adds agents after the rest)."""
    agents = Agent.objects.bulk_create(
        [
            _agent_row(run, attempt, agent, first_position + index, wired[index])
            for index, agent in enumerate(plans)
        ]
    )
    tasks: list[Task] = []
    task_plans: list[TaskPlan] = []
    for agent, agent_plan in zip(agents, plans, strict=True):
        tasks.extend(task_rows(run, agent, agent_plan))
        task_plans.extend(agent_plan.tasks)
    tasks = Task.objects.bulk_create(tasks, batch_size=1000)
    # Streamed, task by task: a run may hold 20,000 steps (common/copy.py says why).
    copy_insert(
        Step,
        (
            step
            for task, task_plan in zip(tasks, task_plans, strict=True)
            for step in step_rows(run, task, task_plan, reuse=reuse)
        ),
    )
    return agents
