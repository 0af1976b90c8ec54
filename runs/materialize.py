"""Turn a run's plan into Agent, Task and Step rows for one attempt.

Runs carry no agents until a worker picks them up (seed 000: PENDING has
agent_count = 0); ``run_pick_up`` calls ``materialize`` in the transaction that moves the
run to RUNNING. Rows are bulk-inserted: a 5,000-step plan is a handful of statements.
"""

from __future__ import annotations

from runs.models import Agent, Run, RunAttempt, Step, Task
from runs.spec import AgentPlan, Plan, StepPlan, TaskPlan


def _agent_row(run: Run, attempt: RunAttempt, plan: AgentPlan, position: int) -> Agent:
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
        pending_dependencies=len(plan.depends_on),
        task_count=len(plan.tasks),
        timeout_ms=plan.timeout_ms,
    )


def task_row(run: Run, agent: Agent, plan: TaskPlan, position: int, generation: int = 0) -> Task:
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
        pending_dependencies=len(plan.depends_on),
        step_count=len(plan.steps),
        timeout_ms=plan.timeout_ms,
    )


def step_row(run: Run, task: Task, plan: StepPlan, position: int, generation: int = 0) -> Step:
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
        on_error=[_handler_spec(handler) for handler in plan.on_error],
        retry=plan.retry.as_dict(),
        timeout_ms=plan.timeout_ms,
        depends_on=list(plan.depends_on),
        pending_dependencies=len(plan.depends_on),
    )


def _handler_spec(plan: StepPlan) -> dict[str, object]:
    """What an `on_error` handler needs to be created later, if its step fails."""
    return {
        "name": plan.name,
        "tool": plan.tool,
        "params": plan.params,
        "when": plan.when,
        "retry": plan.retry.as_dict(),
        "timeout_ms": plan.timeout_ms,
    }


def materialize(run: Run, attempt: RunAttempt, plan: Plan) -> list[Agent]:
    agents = Agent.objects.bulk_create(
        [_agent_row(run, attempt, agent, index) for index, agent in enumerate(plan.agents)]
    )
    tasks: list[Task] = []
    task_plans: list[TaskPlan] = []
    for agent, agent_plan in zip(agents, plan.agents, strict=True):
        for index, task_plan in enumerate(agent_plan.tasks):
            tasks.append(task_row(run, agent, task_plan, index))
            task_plans.append(task_plan)
    tasks = Task.objects.bulk_create(tasks, batch_size=1000)
    steps = [
        step_row(run, task, step_plan, index)
        for task, task_plan in zip(tasks, task_plans, strict=True)
        for index, step_plan in enumerate(task_plan.steps)
    ]
    Step.objects.bulk_create(steps, batch_size=1000)
    return agents
