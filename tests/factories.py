"""Builders for test data: organizations, keys, plans and runs in any state."""

from __future__ import annotations

import itertools
from decimal import Decimal
from typing import Any

from django.db import transaction
from django.db.models import F

from billing.models import Organization
from billing.services import api_key_create, credits_charge, credits_grant, organization_create
from runs.models import Agent, Run, RunAttempt, Step, Task
from runs.services import run_create

_counter = itertools.count()


def org(name: str | None = None, credits: int | str = 1000) -> Organization:
    """An organization, with ``credits`` granted (0 for none)."""
    organization = organization_create(name=name or f"org-{next(_counter)}")
    if credits:
        credits_grant(organization=organization, amount=credits, reason="test setup")
        organization.refresh_from_db()
    return organization


def org_with_key(name: str | None = None) -> tuple[Organization, str]:
    organization = org(name)
    _, raw = api_key_create(organization=organization)
    return organization, raw


def step(name: str = "s1", tool: str = "noop", **extra: Any) -> dict[str, Any]:
    return {"name": name, "tool": tool, **extra}


def plan(
    *,
    name: str = "test-run",
    agents: int = 1,
    tasks: int = 1,
    steps: int = 2,
    tool: str = "noop",
    **extra: Any,
) -> dict[str, Any]:
    """A valid plan of ``agents`` x ``tasks`` x ``steps`` sequential no-op steps."""
    return {
        "name": name,
        "agents": [
            {
                "name": f"agent-{a}",
                "tasks": [
                    {
                        "name": f"task-{t}",
                        "steps": [step(f"step-{s}", tool) for s in range(steps)],
                    }
                    for t in range(tasks)
                ],
            }
            for a in range(agents)
        ],
        **extra,
    }


def fan(width: int, name: str = "fan", *, join: bool = True, **step_extra: Any) -> dict[str, Any]:
    """``width`` no-op steps s0, s1, ... all running at once (their recordings commit in
    their own order), then, with ``join``, a task of one step, j."""
    tasks = [
        {
            "name": "fan",
            "mode": "parallel",
            "max_concurrent_steps": width,
            "steps": [step(f"s{n}", **step_extra) for n in range(width)],
        }
    ]
    if join:
        tasks.append({"name": "join", "steps": [step("j")]})
    return plan(name=name, steps=0) | {"agents": [{"name": "a", "tasks": tasks}]}


def sleeper_plan(seconds: float) -> dict[str, Any]:
    """One step of the `sleep` tool: a run that stays RUNNING for ``seconds``."""
    spec = plan(name="sleeper", steps=0)
    spec["agents"][0]["tasks"][0]["steps"] = [
        {"name": "nap", "tool": "sleep", "params": {"seconds": seconds}}
    ]
    return spec


def approval_plan() -> dict[str, Any]:
    """An echo step, then one waiting for approval."""
    spec = plan(name="sign-off", steps=1, tool="echo")
    spec["agents"][0]["tasks"][0]["steps"].append(step("gate", "approval"))
    return spec


def run(organization: Organization | None = None, **plan_options: Any) -> Run:
    return run_create(organization=organization or org(), plan=plan(**plan_options))


def hierarchy(status: dict[str, str] | None = None) -> tuple[Run, Agent, Task, Step]:
    """A run with one attempt, agent, task and step, rows written directly in any state."""
    status = status or {}
    organization = org()
    the_run = Run.objects.create(
        organization=organization,
        name="direct",
        plan=plan(),
        status=status.get("run", "running"),
        attempt_number=1,
        agent_count=1,
    )
    attempt = RunAttempt.objects.create(run=the_run, attempt_number=1)
    agent = Agent.objects.create(
        run=the_run,
        attempt=attempt,
        attempt_number=1,
        name="a",
        position=0,
        task_count=1,
        status=status.get("agent", "running"),
    )
    task = Task.objects.create(
        run=the_run,
        agent=agent,
        attempt_number=1,
        name="t",
        position=0,
        step_count=1,
        status=status.get("task", "running"),
    )
    the_step = Step.objects.create(
        run=the_run,
        task=task,
        attempt_number=1,
        name="s",
        position=0,
        tool="noop",
        status=status.get("step", "pending"),
    )
    return the_run, agent, task, the_step


def charge(step: Step, amount: Decimal | int | str) -> Decimal:
    """Stand in for the engine's recording of one of ``step``'s attempts that cost
    ``amount``: drawn on its run attempt's reservation and added to the step's cost, in one
    transaction (BudgetExhausted: neither). Returns the amount drawn."""
    with transaction.atomic():
        drawn = credits_charge(
            run_id=step.run_id, attempt_number=step.attempt_number, amount=amount
        )
        Step.objects.filter(pk=step.pk).update(cost=F("cost") + drawn)
    return drawn


def finish_all_work(run: Run, status: str = "completed") -> None:
    """Stand in for the engine: move every open node of the current attempt to ``status``.

    Goes through the real transition service, pending -> running -> ``status``.
    """
    from runs.transitions import transition

    models: tuple[Any, ...] = (Step, Task, Agent)
    for model in models:
        rows = model.objects.filter(run=run, attempt_number=run.attempt_number)
        for row in rows.exclude(status__in=["completed", "failed", "skipped", "cancelled"]):
            if row.status in ("pending", "paused", "waiting_approval"):
                if row.status == "paused":
                    transition(model, row.pk, "pending")
                if row.status != "waiting_approval":
                    transition(model, row.pk, "running")
            transition(model, row.pk, status)
