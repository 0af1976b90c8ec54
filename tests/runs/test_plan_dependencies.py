"""A plan's dependencies (runs/plan/): `depends_on` only under `mode: dag`, to names that
exist, never to itself or twice, and no cycles, reported with the cycle; a long chain
validated without recursion."""

from __future__ import annotations

from typing import Any

import pytest

from runs.plan import PlanError
from tests.runs.plans import (
    STEP,
    agent,
    assert_only_error,
    dag_of_steps,
    errors_of,
    plan,
    step,
    task,
    valid,
)


@pytest.mark.parametrize(
    ("data", "path", "fragment"),
    [
        (
            plan(agent("a1", task("t1", step("s1"), step("s2", depends_on=["s1"])))),
            "agents[0].tasks[0].steps[1].depends_on",
            "needs mode 'dag' on agents[0].tasks[0] (it is 'sequential')",
        ),
        (
            plan(agent("a1", task("t1"), task("t2", depends_on=["t1"]), mode="parallel")),
            "agents[0].tasks[1].depends_on",
            "needs mode 'dag' on agents[0] (it is 'parallel')",
        ),
        (
            plan(agent("a1"), agent("a2", depends_on=["a1"])),
            "agents[1].depends_on",
            "needs mode 'dag' on the run (it is 'parallel')",
        ),
    ],
    ids=["step", "task", "agent"],
)
def test_depends_on_without_mode_dag_is_refused(
    data: dict[str, Any], path: str, fragment: str
) -> None:
    assert_only_error(data, path, fragment)


def test_depends_on_under_a_refused_mode_is_still_checked_but_not_blamed_on_the_mode() -> None:
    data = plan(agent("a1", task("t1"), task("t2", depends_on=["t1", "t9"]), mode="DAG"))
    assert [path for path, _ in errors_of(data)] == [
        "agents[0].mode",
        "agents[0].tasks[1].depends_on[1]",
    ]


def test_an_empty_depends_on_is_fine_in_any_mode() -> None:
    valid(plan(agent("a1", task("t1", step("s1", depends_on=[])))))


def test_an_unknown_dependency_is_reported_with_its_path() -> None:
    data = plan(
        agent("researcher", task("gather"), task("summarise", depends_on=["gahter"]), mode="dag")
    )
    errors = errors_of(data)
    assert [str(PlanError(*error)) for error in errors] == [
        "agents[0].tasks[1].depends_on[0]: unknown task 'gahter'; did you mean 'gather'?"
    ]


@pytest.mark.parametrize(
    ("data", "path", "message"),
    [
        (
            plan(agent("a1", task("t1", step("s1", depends_on=["s1"]), mode="dag"))),
            f"{STEP}.depends_on[0]",
            "step 's1' cannot depend on itself",
        ),
        (
            plan(agent("a1", task("t1", depends_on=["t1"]), mode="dag")),
            "agents[0].tasks[0].depends_on[0]",
            "task 't1' cannot depend on itself",
        ),
        (
            plan(agent("a1", depends_on=["a1"]), mode="dag"),
            "agents[0].depends_on[0]",
            "agent 'a1' cannot depend on itself",
        ),
    ],
    ids=["step", "task", "agent"],
)
def test_a_self_dependency_is_refused(data: dict[str, Any], path: str, message: str) -> None:
    assert errors_of(data) == [(path, message)]


def test_a_duplicate_dependency_is_refused() -> None:
    data = plan(
        agent("a1", task("t1", step("s1"), step("s2", depends_on=["s1", "s1"]), mode="dag"))
    )
    assert errors_of(data) == [
        ("agents[0].tasks[0].steps[1].depends_on[1]", "duplicate dependency 's1'")
    ]


@pytest.mark.parametrize(
    ("depends_on", "got"),
    [("s1", "'s1'"), ([1], "[1]"), (None, "null"), ([["s1"]], '[["s1"]]'), ({"s1": 1}, '{"s1":1}')],
)
def test_depends_on_must_be_a_list_of_names(depends_on: Any, got: str) -> None:
    data = plan(agent("a1", task("t1", step("s1"), step("s2", depends_on=depends_on), mode="dag")))
    assert errors_of(data) == [
        ("agents[0].tasks[0].steps[1].depends_on", f"must be a list of step names, got {got}")
    ]


@pytest.mark.parametrize(
    ("data", "path", "cycle"),
    [
        (dag_of_steps(a=["b"], b=["a"]), f"{STEP}.depends_on", "a -> b -> a"),
        (
            dag_of_steps(x=[], a=["b"], b=["c"], c=["a"]),
            "agents[0].tasks[0].steps[1].depends_on",
            "a -> b -> c -> a",
        ),
        (
            plan(
                agent(
                    "a1", task("t1", depends_on=["t2"]), task("t2", depends_on=["t1"]), mode="dag"
                )
            ),
            "agents[0].tasks[0].depends_on",
            "t1 -> t2 -> t1",
        ),
        (
            plan(agent("a1", depends_on=["a2"]), agent("a2", depends_on=["a1"]), mode="dag"),
            "agents[0].depends_on",
            "a1 -> a2 -> a1",
        ),
    ],
    ids=["two-steps", "three-steps", "tasks", "agents"],
)
def test_a_dependency_cycle_is_reported_with_the_cycle(
    data: dict[str, Any], path: str, cycle: str
) -> None:
    assert errors_of(data) == [(path, f"dependency cycle: {cycle}")]


def test_every_separate_cycle_is_reported() -> None:
    data = dag_of_steps(a=["b"], b=["a"], ok=["a"], c=["d"], d=["e"], e=["c"])
    assert errors_of(data) == [
        (f"{STEP}.depends_on", "dependency cycle: a -> b -> a"),
        ("agents[0].tasks[0].steps[3].depends_on", "dependency cycle: c -> d -> e -> c"),
    ]


def test_a_cycle_reachable_from_a_dependency_is_reported_once() -> None:
    data = dag_of_steps(start=["a"], a=["b"], b=["c"], c=["a"])
    assert errors_of(data) == [
        ("agents[0].tasks[0].steps[1].depends_on", "dependency cycle: a -> b -> c -> a")
    ]


@pytest.mark.parametrize("backward", [False, True], ids=["listed-in-order", "listed-backwards"])
def test_a_long_dependency_chain_validates_without_recursion(backward: bool) -> None:
    count = 3000
    chain = []
    for i in range(count):
        j = i + 1 if backward else i - 1
        chain.append(step(f"s{i}", depends_on=[f"s{j}"]) if 0 <= j < count else step(f"s{i}"))
    top, bottom = ("s0", f"s{count - 1}") if backward else (f"s{count - 1}", "s0")
    last = step("last", depends_on=[top], params={"x": f"${{steps.{bottom}.output}}"})
    result = valid(plan(agent("a1", task("t1", *chain, last, mode="dag"))))
    assert result.step_count == count + 1
