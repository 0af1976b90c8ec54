"""Runs execute on a real worker: order, limits, dependencies, billing."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from runs.models import Step
from tests.factories import plan, step
from tests.integration.engine_support import assert_books_balanced, steps_of, submit, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def test_a_sequential_run_completes_in_order(celery_worker: str) -> None:
    run = submit(plan(steps=5))

    done = wait_for(run)

    assert done.status == "completed", done.last_error
    steps = sorted(Step.objects.filter(run=run), key=lambda s: s.position)
    assert [s.status for s in steps] == ["completed"] * 5
    starts = [s.started_at for s in steps]
    ends = [s.completed_at for s in steps]
    for before_end, after_start in zip(ends, starts[1:], strict=False):
        assert before_end <= after_start

    assert_books_balanced(run)


def test_runs_begun_at_their_start_complete_on_a_worker(celery_worker: str, settings: Any) -> None:
    # A small run admitted at its start is RUNNING when run_start returns; its first
    # steps' doorbells reach the worker after the start's commit.
    settings.ENGINE_START_AT_ONCE_STEPS = 200
    wide = plan(steps=0) | {
        "agents": [
            {
                "name": "a",
                "tasks": [
                    {
                        "name": "fan",
                        "mode": "parallel",
                        "max_concurrent_steps": 20,
                        "steps": [step(f"s{i}") for i in range(20)],
                    },
                    {"name": "join", "steps": [step("j")]},
                ],
            }
        ],
    }
    runs = [submit(plan(steps=5)), submit(wide)]

    assert [run.status for run in runs] == ["running", "running"]
    finished = [wait_for(run) for run in runs]
    for done in finished:
        assert done.status == "completed", done.last_error
        assert done.picked_up_at is not None
        assert_books_balanced(done)


def _max_overlap(intervals: list[tuple[Any, Any]]) -> int:
    points = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    # An end and a start at the same instant do not overlap: ends sort first (-1 < 1).
    best = current = 0
    for _, delta in points:
        current += delta
        best = max(best, current)
    return best


def test_a_parallel_task_never_exceeds_its_concurrency_limit(celery_worker: str) -> None:
    spec = {
        "name": "limited",
        "agents": [
            {
                "name": "a",
                "tasks": [
                    {
                        "name": "fan",
                        "mode": "parallel",
                        "max_concurrent_steps": 1,
                        "steps": [
                            step(f"s{i}", "sleep", params={"seconds": 0.2}) for i in range(6)
                        ],
                    }
                ],
            }
        ],
    }
    run = submit(spec)

    done = wait_for(run)

    assert done.status == "completed", done.last_error
    intervals = [(s.started_at, s.completed_at) for s in Step.objects.filter(run=run)]
    assert _max_overlap(intervals) == 1  # two worker processes, but the limit is 1
    assert_books_balanced(run)


def test_parallel_agents_and_tasks_respect_their_limits(celery_worker: str) -> None:
    def agent(name: str) -> dict[str, object]:
        return {
            "name": name,
            "mode": "parallel",
            "max_concurrent_tasks": 1,
            "tasks": [
                {"name": f"t{i}", "steps": [step("s", "sleep", params={"seconds": 0.15})]}
                for i in range(3)
            ],
        }

    run = submit({"name": "agents", "max_agents": 2, "agents": [agent("x"), agent("y")]})

    done = wait_for(run)

    assert done.status == "completed", done.last_error
    for name in ("x", "y"):
        steps = Step.objects.filter(run=run, task__agent__name=name)
        assert _max_overlap([(s.started_at, s.completed_at) for s in steps]) == 1


def test_a_dag_runs_each_task_after_its_dependencies(celery_worker: str) -> None:
    edges = {"a": [], "b": ["a"], "c": ["a"], "d": ["b", "c"], "e": ["d"], "f": []}
    spec = {
        "name": "dag",
        "agents": [
            {
                "name": "g",
                "mode": "dag",
                "max_concurrent_tasks": 10,
                "tasks": [
                    {
                        "name": name,
                        "depends_on": deps,
                        "steps": [step("s", "sleep", params={"seconds": 0.05})],
                    }
                    for name, deps in edges.items()
                ],
            }
        ],
    }
    run = submit(spec)

    done = wait_for(run)

    assert done.status == "completed", done.last_error
    by_task = {s.task.name: s for s in Step.objects.filter(run=run).select_related("task")}
    for name, deps in edges.items():
        for dep in deps:
            assert by_task[dep].completed_at <= by_task[name].started_at, (dep, name)
    assert_books_balanced(run)


def test_templates_pass_outputs_along_and_conditions_skip_steps(celery_worker: str) -> None:
    spec = plan(steps=0) | {
        "variables": {"topic": "chips"},
        "agents": [
            {
                "name": "a",
                "tasks": [
                    {
                        "name": "t",
                        "steps": [
                            step(
                                "first", "echo", params={"value": 21, "topic": "${variables.topic}"}
                            ),
                            step(
                                "second",
                                "python",
                                params={
                                    "callable": "orchestrator.tools.examples.add",
                                    "kwargs": {"a": "${steps.first.output.value}", "b": 21},
                                },
                            ),
                            step("never", "echo", when="${steps.second.output} > 100"),
                            step(
                                "summary",
                                "echo",
                                params={"text": "${variables.topic}: ${steps.second.output}"},
                                when="${steps.never.status} == 'skipped'",
                            ),
                        ],
                    }
                ],
            }
        ],
    }
    run = submit(spec)

    done = wait_for(run)

    assert done.status == "completed", done.last_error
    steps = steps_of(run)
    assert steps["first"].output == {"value": 21, "topic": "chips"}
    assert steps["second"].output == 42
    assert steps["never"].status == "skipped"
    assert steps["summary"].output == {"text": "chips: 42"}
    assert_books_balanced(run)


def test_the_engines_tasks_leave_no_result_in_redis(
    celery_worker: str, broker: redis.Redis[bytes]
) -> None:
    # PostgreSQL holds every outcome. A result stored per step would cost Redis a write
    # per step, and a worker storing one during a Redis restart crashed its main process
    # (found by make chaos): the engine's messages ask for no result.
    run = submit(plan(steps=3))

    assert wait_for(run).status == "completed"

    task_ids = [s.celery_task_id for s in Step.objects.filter(run=run)]
    assert all(task_ids)
    assert broker.exists(*(f"celery-task-meta-{task_id}" for task_id in task_ids)) == 0
