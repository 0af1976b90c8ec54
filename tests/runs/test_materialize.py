"""runs.materialize: the rows ``runs.attempt_materialize`` writes are the rows the plan
says, the columns nobody sets the models' defaults, and ids in plan order."""

from __future__ import annotations

from typing import Any

import pytest
from django.forms.models import model_to_dict

from runs import materialize, services
from runs.engine.start import run_start
from runs.models import Agent, Run, Step, Task
from runs.selectors import run_history
from tests import factories

pytestmark = pytest.mark.django_db

# Text with COPY's and JSON's own escapes, quotes, a NUL-free control character and
# non-ASCII: what a column could mangle on its way through JSON into SQL.
AWKWARD = "tab\there \\N back\\slash 'single' \"double\" \u00e9t\u00e9 \u2603\nline"


def _plan() -> dict[str, Any]:
    """Two agents in a dag; tasks in every mode; steps with every column the plan sets."""
    fix = {"name": "fix", "tool": "echo", "params": {"note": AWKWARD}}
    return {
        "name": "materialised",
        "mode": "dag",
        "agents": [
            {
                "name": "first",
                "mode": "parallel",
                "failure_mode": "continue",
                "max_concurrent_tasks": 3,
                "timeout": "90s",
                "tasks": [
                    {
                        "name": "fan",
                        "mode": "parallel",
                        "max_concurrent_steps": 7,
                        "steps": [{"name": f"leaf-{index}", "tool": "noop"} for index in range(5)],
                    },
                    {
                        "name": "graph",
                        "mode": "dag",
                        "timeout": "1m",
                        "steps": [
                            {
                                "name": "fetch",
                                "tool": "echo",
                                "params": {"text": AWKWARD, "nested": [1, {"a": None}]},
                                "retry": {"max_attempts": 4},
                                "timeout": "1500ms",
                                "on_error": [fix],
                                "cache": {"key": "k:${run.name}", "ttl": "1h"},
                            },
                            {
                                "name": "use",
                                "tool": "echo",
                                "when": "${steps.fetch.output.ok} == true",
                                "depends_on": ["fetch"],
                            },
                        ],
                    },
                ],
            },
            {
                "name": "second",
                "depends_on": ["first"],
                "tasks": [{"name": "chain", "steps": [factories.step("a"), factories.step("b")]}],
            },
        ],
    }


def _picked_up(spec: dict[str, Any]) -> Run:
    run = services.run_create(organization=factories.org(credits=10_000), plan=spec)
    run_start(run_id=run.pk)
    picked, did = services.run_pick_up(run_id=run.pk)
    assert did
    return picked


def _columns(obj: Agent | Task | Step, *skip: str) -> dict[str, Any]:
    """The columns a new row's plan and defaults decide (not its ids, links or clock)."""
    ignored = {"id", "run", "agent", "attempt", "task", "created_at", "status_changed_at"}
    return model_to_dict(obj, exclude=[*ignored, *skip])


def test_the_rows_written_are_the_plans_and_start_as_new_rows_do() -> None:
    run = _picked_up(_plan())
    plan = services.plan_of(run)
    wired_agents = materialize.wire_children(plan.mode, plan.agents)
    agents = list(Agent.objects.filter(run=run).order_by("position"))

    assert [a.name for a in agents] == ["first", "second"]
    for agent, agent_plan, wired in zip(agents, plan.agents, wired_agents, strict=True):
        expected_agent = Agent(
            attempt_number=1,
            open_children=len(agent_plan.tasks),
            **materialize.agent_values(agent_plan, agent.position, wired),
        )
        # The pick-up dispatches what is ready after writing the rows: those columns move.
        moved = ("status", "started_at", "dispatched_at", "active_children")
        assert _columns(agent, *moved) == _columns(expected_agent, *moved)
        assert agent.attempt_id is not None
        tasks = list(Task.objects.filter(agent=agent).order_by("position"))
        assert [t.name for t in tasks] == [t.name for t in agent_plan.tasks]
        for task, task_plan in zip(tasks, agent_plan.tasks, strict=True):
            expected_task = materialize.task_row(
                run, agent, task_plan, task.position, (task.pending_dependencies, task.dependents)
            )
            assert _columns(task, *moved) == _columns(expected_task, *moved)
            steps = list(Step.objects.filter(task=task).order_by("position"))
            wired_steps = materialize.wire_children(task_plan.mode, task_plan.steps)
            expected_steps = materialize.step_rows(run, task, task_plan)
            assert [s.name for s in steps] == [s.name for s in expected_steps]
            for step, expected in zip(steps, expected_steps, strict=True):
                assert _columns(step, "dispatched_at") == _columns(expected, "dispatched_at")
            assert [(s.pending_dependencies, s.dependents) for s in steps] == [
                (count, names) for count, names in wired_steps
            ]


def test_what_json_carries_reaches_the_columns_unchanged() -> None:
    run = _picked_up(_plan())
    fetch = Step.objects.get(run=run, name="fetch")

    assert fetch.params == {"text": AWKWARD, "nested": [1, {"a": None}]}
    assert fetch.on_error[0]["params"] == {"note": AWKWARD}
    assert fetch.timeout_ms == 1500
    assert fetch.cache == {"key": "k:${run.name}", "ttl_ms": 3_600_000, "inputs": True}
    assert fetch.reused_from is None  # JSON null is SQL NULL, not the JSON value null
    assert Step.objects.filter(run=run, reused_from__isnull=True).count() == 9
    assert Step.objects.get(run=run, name="use").when == "${steps.fetch.output.ok} == true"


def test_ids_follow_the_plan_and_a_wide_plan_goes_in_batches(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(materialize, "STEPS_PER_STATEMENT", 3)
    spec = factories.plan(agents=2, tasks=2, steps=4)  # 16 steps: 6 statements of them
    run = services.run_create(organization=factories.org(credits=10_000), plan=spec)
    run_start(run_id=run.pk)

    picked, _ = services.run_pick_up(run_id=run.pk)

    steps = list(Step.objects.filter(run=picked).order_by("id"))
    assert [(s.task.agent.position, s.task.position, s.position) for s in steps] == [
        (a, t, s) for a in range(2) for t in range(2) for s in range(4)
    ]
    assert all(s.task.name == f"task-{s.task.position}" for s in steps)
    tasks = list(Task.objects.filter(run=picked).order_by("id"))
    assert [(t.agent.position, t.position) for t in tasks] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert list(Agent.objects.filter(run=picked).order_by("id").values_list("position")) == [
        (0,),
        (1,),
    ]
    assert picked.agent_count == picked.open_children == 2


def test_a_pick_up_moves_the_run_with_its_rows_and_its_copy_is_the_stored_row() -> None:
    run = services.run_create(organization=factories.org(credits=10_000), plan=_plan())
    run_start(run_id=run.pk)

    picked, _ = services.run_pick_up(run_id=run.pk)

    stored = Run.objects.get(pk=run.pk)
    columns = [f.attname for f in Run._meta.concrete_fields]
    # What the pick-up hands its caller is the row as runs.run_pick_up left it.
    assert {c: getattr(picked, c) for c in columns} == {c: getattr(stored, c) for c in columns}
    assert (stored.status, stored.agent_count, stored.open_children) == ("running", 2, 2)
    assert stored.picked_up_at == stored.status_changed_at == stored.last_heartbeat
    moves = run_history(run).filter(entity="run", to_status="running")
    assert [(e.from_status, e.actor, e.attempt_number) for e in moves] == [("pending", "worker", 1)]
