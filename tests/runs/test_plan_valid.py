"""Valid plans (runs/plan/): a full plan validated and normalised, defaults filled in,
timeouts inherited, dependencies kept; the run service stores a valid plan as submitted
and nothing for an invalid one."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from runs.models import HistoryEvent, Run
from runs.plan import PlanInvalid, RetryPolicy
from runs.services import run_create
from tests import factories
from tests.runs.plans import agent, dag_of_steps, one_step, plan, step, task, valid


def market_research_plan() -> dict[str, Any]:
    """A plan of every level's options, with real tools and no placeholders."""
    return {
        "name": "market-research",
        "priority": 5,
        "failure_mode": "fail-fast",
        "max_attempts": 3,
        "credits": 500,
        "variables": {"topic": "AI chips"},
        "timeouts": {"run": "24h", "agent": "6h", "task": "1h", "step": "30s"},
        "max_agents": 10,
        "agents": [
            {
                "name": "researcher",
                "failure_mode": "retry",
                "mode": "dag",
                "max_concurrent_tasks": 5,
                "tasks": [
                    {
                        "name": "gather",
                        "mode": "parallel",
                        "max_concurrent_steps": 3,
                        "failure_mode": "continue",
                        "steps": [
                            {
                                "name": "search",
                                "tool": "http",
                                "params": {
                                    "url": "https://example.invalid/search?q=${variables.topic}"
                                },
                                "retry": {
                                    "max_attempts": 3,
                                    "backoff": "exponential",
                                    "base_delay_ms": 100,
                                    "max_delay_ms": 30000,
                                    "jitter": 0.1,
                                    "retry_on": ["timeout", "rate_limited"],
                                    "max_failures": 5,
                                },
                                "timeout": "30s",
                            }
                        ],
                    },
                    {
                        "name": "summarise",
                        "depends_on": ["gather"],
                        "steps": [
                            {
                                "name": "draft",
                                "tool": "llm",
                                "params": {
                                    "prompt": "Summarise ${tasks.gather.steps.search.output.body}"
                                },
                                "when": "${tasks.gather.status} == 'completed'",
                                "on_error": [
                                    {
                                        "name": "notify",
                                        "tool": "http",
                                        "params": {
                                            "url": "https://example.invalid/alert",
                                            "body": "${error.code}: ${error.message}",
                                        },
                                    }
                                ],
                            },
                            {"name": "sign-off", "tool": "approval"},
                        ],
                    },
                ],
            }
        ],
    }


def test_a_full_plan_validates_and_is_normalised() -> None:
    result = valid(market_research_plan())
    assert (result.name, result.priority, result.failure_mode, result.mode) == (
        "market-research",
        5,
        "fail-fast",
        "parallel",
    )
    assert (result.max_attempts, result.max_agents, result.credits) == (3, 10, Decimal(500))
    assert result.variables == {"topic": "AI chips"}
    assert result.timeouts_ms == {
        "run": 86_400_000,
        "agent": 21_600_000,
        "task": 3_600_000,
        "step": 30_000,
    }
    assert result.step_count == 3

    (researcher,) = result.agents
    assert (researcher.mode, researcher.failure_mode, researcher.max_concurrent_tasks) == (
        "dag",
        "retry",
        5,
    )
    assert (researcher.depends_on, researcher.timeout_ms) == ((), 21_600_000)

    gather, summarise = researcher.tasks
    assert (gather.mode, gather.failure_mode, gather.max_concurrent_steps) == (
        "parallel",
        "continue",
        3,
    )
    assert (gather.depends_on, gather.timeout_ms) == ((), 3_600_000)
    assert (summarise.mode, summarise.failure_mode, summarise.max_concurrent_steps) == (
        "sequential",
        "fail-fast",
        3,
    )
    assert summarise.depends_on == ("gather",)

    (search,) = gather.steps
    assert search.tool == "http"
    assert search.params == {"url": "https://example.invalid/search?q=${variables.topic}"}
    assert search.timeout_ms == 30_000
    assert search.retry == RetryPolicy(
        max_attempts=3,
        max_failures=5,
        backoff="exponential",
        base_delay_ms=100,
        max_delay_ms=30_000,
        jitter=0.1,
        retry_on=("timeout", "rate_limited"),
    )

    draft, sign_off = summarise.steps
    assert draft.when == "${tasks.gather.status} == 'completed'"
    assert (draft.retry, draft.timeout_ms, draft.depends_on) == (RetryPolicy(), 30_000, ())
    (notify,) = draft.on_error
    assert (notify.name, notify.tool, notify.timeout_ms, notify.on_error) == (
        "notify",
        "http",
        30_000,
        (),
    )
    assert (sign_off.tool, sign_off.when, sign_off.params, sign_off.on_error) == (
        "approval",
        "",
        {},
        (),
    )


def test_defaults_are_filled_in() -> None:
    result = valid(factories.plan(agents=1, tasks=1, steps=1))
    assert (result.priority, result.failure_mode, result.mode, result.max_attempts) == (
        5,
        "fail-fast",
        "parallel",
        3,
    )
    assert (result.max_agents, result.credits, result.variables, result.timeouts_ms) == (
        10,
        None,
        {},
        {},
    )
    (the_agent,) = result.agents
    assert (the_agent.mode, the_agent.failure_mode, the_agent.max_concurrent_tasks) == (
        "sequential",
        "fail-fast",
        5,
    )
    assert (the_agent.depends_on, the_agent.timeout_ms) == ((), None)
    (the_task,) = the_agent.tasks
    assert (the_task.mode, the_task.failure_mode, the_task.max_concurrent_steps) == (
        "sequential",
        "fail-fast",
        3,
    )
    assert (the_task.depends_on, the_task.timeout_ms) == ((), None)
    (only,) = the_task.steps
    assert (
        only.params,
        only.when,
        only.retry,
        only.timeout_ms,
        only.depends_on,
        only.on_error,
    ) == (
        {},
        "",
        RetryPolicy(),
        None,
        (),
        (),
    )


def test_a_step_timeout_is_inherited_from_timeouts_step_unless_set() -> None:
    data = plan(
        agent("a1", task("t1", step("own", timeout="2s"), step("inherits")), timeout="1h"),
        timeouts={"step": 45, "task": "10m"},
    )
    result = valid(data)
    assert [s.timeout_ms for s in result.agents[0].tasks[0].steps] == [2000, 45_000]
    assert result.agents[0].tasks[0].timeout_ms == 600_000
    assert result.agents[0].timeout_ms == 3_600_000


def test_depends_on_is_preserved_at_every_level() -> None:
    data = plan(
        agent("a1"),
        agent(
            "a2",
            task("t1"),
            task(
                "t2",
                step("s1"),
                step("s2"),
                step("s3", depends_on=["s2", "s1"]),
                mode="dag",
                depends_on=["t1"],
            ),
            mode="dag",
            depends_on=["a1"],
        ),
        mode="dag",
    )
    result = valid(data)
    a2 = result.agents[1]
    assert a2.depends_on == ("a1",)
    assert [t.depends_on for t in a2.tasks] == [(), ("t1",)]
    assert [s.depends_on for s in a2.tasks[1].steps] == [(), (), ("s2", "s1")]


def test_the_factory_plan_is_valid() -> None:
    assert valid(factories.plan(agents=2, tasks=3, steps=4)).step_count == 24


# --------------------------------------------------------------------------- nothing stored
@pytest.mark.django_db
@pytest.mark.parametrize(
    "bad",
    [
        [],
        plan(agents=[]),
        one_step(tool="nope"),
        plan(agent("a1", task("gather"), task("summarise", depends_on=["gahter"]), mode="dag")),
        dag_of_steps(a=["b"], b=["a"]),
        one_step(params={"url": "${"}),
        one_step(timeout="30x"),
        plan(credits=-5),
        plan(priority="5"),
    ],
    ids=[
        "not-an-object",
        "no-agents",
        "unknown-tool",
        "unknown-dependency",
        "cycle",
        "bad-template",
        "bad-duration",
        "credits",
        "priority",
    ],
)
def test_run_create_stores_nothing_for_an_invalid_plan(bad: Any) -> None:
    organization = factories.org()
    runs, events = Run.objects.count(), HistoryEvent.objects.count()
    with pytest.raises(PlanInvalid):
        run_create(organization=organization, plan=bad)
    assert (Run.objects.count(), HistoryEvent.objects.count()) == (runs, events)


@pytest.mark.django_db
def test_run_create_stores_a_valid_plan_as_submitted() -> None:
    organization = factories.org()
    runs, events = Run.objects.count(), HistoryEvent.objects.count()
    run = run_create(organization=organization, plan=market_research_plan())
    assert (Run.objects.count(), HistoryEvent.objects.count()) == (runs + 1, events + 1)
    run.refresh_from_db()
    assert (run.name, run.priority, run.plan) == ("market-research", 5, market_research_plan())
