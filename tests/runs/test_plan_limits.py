"""A plan's size limits (runs/plan/): bytes, nesting and counts, each refused before
anything else is looked at; and every other problem reported at once, as paths and
messages."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.conf import settings as django_settings

from runs.plan import Limits, PlanError, PlanInvalid, errors_as_dicts, parse_plan
from tests import factories
from tests.runs.plans import STEP, agent, errors_of, limits, one_step, plan, step, task, valid


def test_a_plan_over_the_byte_limit_is_refused_before_anything_else() -> None:
    data = plan(variables={"blob": "x" * 2000}, priority=99)
    size = len(json.dumps(data, separators=(",", ":")))
    errors = errors_of(data, limits(max_spec_bytes=1000))
    assert errors == [("", f"plan is {size} bytes; at most 1000 allowed")]


def test_the_size_hint_is_trusted_for_the_byte_limit() -> None:
    with pytest.raises(PlanInvalid, match="plan is 2000000 bytes; at most 1000000 allowed"):
        parse_plan(plan(), limits=limits(max_spec_bytes=1_000_000), size_hint=2_000_000)


def test_non_ascii_is_measured_in_utf8_bytes() -> None:
    data = plan(variables={"t": "é" * 100})
    size = len(json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode())
    assert size < len(json.dumps(data, separators=(",", ":")))  # not counted as \\u00e9
    valid(data, limits(max_spec_bytes=size))
    assert errors_of(data, limits(max_spec_bytes=size - 1)) == [
        ("", f"plan is {size} bytes; at most {size - 1} allowed")
    ]


def test_a_plan_nested_too_deeply_is_refused() -> None:
    # plan 1, agents 2, agent 3, tasks 4, task 5, steps 6, step 7, params 8, a 9, b 10
    data = one_step(params={"a": {"b": 1}})
    assert errors_of(data, limits(max_json_depth=9)) == [("", "plan nests deeper than 9 levels")]
    valid(data, limits(max_json_depth=10))


def test_a_very_deep_plan_is_refused_without_recursion() -> None:
    deep: Any = "bottom"
    for _ in range(100_000):
        deep = [deep]
    limit = django_settings.ORCHESTRATOR_PLAN_LIMITS["max_json_depth"]
    assert errors_of(one_step(params={"deep": deep})) == [
        ("", f"plan nests deeper than {limit} levels")
    ]


@pytest.mark.parametrize(
    ("data", "small", "path", "message"),
    [
        (
            plan(agent("a1"), agent("a2"), agent("a3")),
            limits(max_agents=2),
            "agents",
            "has 3 entries; at most 2 allowed",
        ),
        (
            plan(agent("a1", task("t1"), task("t2"), task("t3"))),
            limits(max_tasks_per_agent=2),
            "agents[0].tasks",
            "has 3 entries; at most 2 allowed",
        ),
        (
            plan(agent("a1", task("t1", step("s1"), step("s2"), step("s3")))),
            limits(max_steps_per_task=2),
            "agents[0].tasks[0].steps",
            "has 3 entries; at most 2 allowed",
        ),
        (
            factories.plan(agents=2, tasks=2, steps=2),
            limits(max_steps_per_run=7),
            "agents",
            "plan has 8 steps (on_error handlers included); at most 7 allowed",
        ),
        (
            one_step(on_error=[step("h1"), step("h2")]),
            limits(max_on_error=1),
            f"{STEP}.on_error",
            "has 2 handlers; at most 1 allowed",
        ),
    ],
    ids=["agents", "tasks-per-agent", "steps-per-task", "steps-per-run", "handlers"],
)
def test_a_plan_over_a_count_limit_is_refused(
    data: dict[str, Any], small: Limits, path: str, message: str
) -> None:
    assert errors_of(data, small) == [(path, message)]


def test_handlers_count_towards_the_steps_per_run_limit() -> None:
    data = one_step(on_error=[step("h1")])
    assert errors_of(data, limits(max_steps_per_run=1)) == [
        ("agents", "plan has 2 steps (on_error handlers included); at most 1 allowed")
    ]
    valid(data, limits(max_steps_per_run=2))


# --------------------------------------------------------------------------- all at once
def test_every_problem_is_reported_at_once() -> None:
    data = plan(
        agent(
            "a1",
            task(
                "t1",
                step("s1", tool="nope", params={"url": "${"}),
                step("s2", timeout="30x", depend_on=["s1"]),
            ),
            task("t2", depends_on=["t3"]),
            mode="dag",
        ),
        priority=10,
        credits=-1,
        timeouts={"step": True},
    )
    errors = errors_of(data)
    assert sorted(path for path, _ in errors) == sorted(
        [
            "priority",
            "credits",
            "timeouts.step",
            "agents[0].tasks[1].depends_on[0]",
            f"{STEP}.tool",
            f"{STEP}.params.url",
            "agents[0].tasks[0].steps[1].depend_on",
            "agents[0].tasks[0].steps[1].timeout",
        ]
    )


def test_plan_invalid_reads_as_path_and_message() -> None:
    with pytest.raises(PlanInvalid) as caught:
        parse_plan(plan(priority=10, agents=[]))
    assert caught.value.code == "invalid_plan"
    assert str(caught.value) == (
        "agents: must not be empty; priority: must be an integer from 0 to 9, got 10"
    )
    assert errors_as_dicts(caught.value.errors) == [
        {"path": "agents", "message": "must not be empty"},
        {"path": "priority", "message": "must be an integer from 0 to 9, got 10"},
    ]
    assert (
        str(PlanError("", "plan nests deeper than 32 levels")) == "plan nests deeper than 32 levels"
    )
