"""The run-plan validator (runs/plan/): every class of bad plan, with exact paths.

Most tests build a small valid plan, break one thing, and check that exactly one problem
is reported, at the expected path, with a recognisable message. Size limits use a small
custom `Limits` so the tests stay fast.
"""

from __future__ import annotations

import dataclasses
import json
from decimal import Decimal
from typing import Any

import pytest
from django.conf import settings as django_settings
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runs.models import HistoryEvent, Run
from runs.plan import (
    Limits,
    Plan,
    PlanError,
    PlanInvalid,
    RetryPolicy,
    errors_as_dicts,
    parse_duration_ms,
    parse_plan,
)
from runs.services import run_create
from tests import factories

STEP = "agents[0].tasks[0].steps[0]"
HANDLER = f"{STEP}.on_error[0]"


# --------------------------------------------------------------------------- helpers
def step(name: str = "s1", tool: str = "noop", **fields: Any) -> dict[str, Any]:
    return {"name": name, "tool": tool, **fields}


def task(name: str = "t1", *steps: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {"name": name, "steps": list(steps) or [step()], **fields}


def agent(name: str = "a1", *tasks: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {"name": name, "tasks": list(tasks) or [task()], **fields}


def plan(*agents: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {"name": "test-run", "agents": list(agents) or [agent()], **fields}


def one_step(**step_fields: Any) -> dict[str, Any]:
    """A plan of one agent, one task and one step with ``step_fields`` added."""
    return plan(agent("a1", task("t1", step("s1", **step_fields))))


def with_handler(**handler_fields: Any) -> dict[str, Any]:
    """A plan whose only step has one on_error handler with ``handler_fields``."""
    return one_step(on_error=[{"name": "h1", "tool": "noop", **handler_fields}])


def limits(**overrides: Any) -> Limits:
    return dataclasses.replace(Limits.from_settings(), **overrides)


def errors_of(data: Any, plan_limits: Limits | None = None) -> list[tuple[str, str]]:
    with pytest.raises(PlanInvalid) as caught:
        parse_plan(data, limits=plan_limits)
    assert caught.value.errors, "PlanInvalid must carry at least one error"
    return [(error.path, error.message) for error in caught.value.errors]


def assert_only_error(
    data: Any, path: str, fragment: str, plan_limits: Limits | None = None
) -> None:
    """Exactly one problem, at ``path``, whose message contains ``fragment``."""
    errors = errors_of(data, plan_limits)
    assert [p for p, _ in errors] == [path], errors
    assert fragment in errors[0][1], errors


def valid(data: Any, plan_limits: Limits | None = None) -> Plan:
    try:
        return parse_plan(data, limits=plan_limits)
    except PlanInvalid as exc:  # show every problem rather than just "raised"
        pytest.fail(f"expected a valid plan, got: {exc.errors}")


def the_step(result: Plan, task_index: int = 0, step_index: int = 0) -> Any:
    return result.agents[0].tasks[task_index].steps[step_index]


# --------------------------------------------------------------------------- shape
@pytest.mark.parametrize(
    ("data", "got"),
    [([], "a list"), ("plan", "a string"), (5, "a number"), (None, "null"), (True, "a boolean")],
)
def test_a_plan_that_is_not_an_object_is_refused(data: Any, got: str) -> None:
    assert_only_error(data, "", f"must be an object, got {got}")


@pytest.mark.parametrize(
    ("remove", "path"),
    [
        (lambda p: p.pop("name"), "name"),
        (lambda p: p.pop("agents"), "agents"),
        (lambda p: p["agents"][0].pop("name"), "agents[0].name"),
        (lambda p: p["agents"][0].pop("tasks"), "agents[0].tasks"),
        (lambda p: p["agents"][0]["tasks"][0].pop("name"), "agents[0].tasks[0].name"),
        (lambda p: p["agents"][0]["tasks"][0].pop("steps"), "agents[0].tasks[0].steps"),
        (lambda p: p["agents"][0]["tasks"][0]["steps"][0].pop("name"), f"{STEP}.name"),
        (lambda p: p["agents"][0]["tasks"][0]["steps"][0].pop("tool"), f"{STEP}.tool"),
    ],
    ids=["run-name", "agents", "agent-name", "tasks", "task-name", "steps", "step-name", "tool"],
)
def test_a_missing_required_field_is_reported_with_its_path(remove: Any, path: str) -> None:
    data = plan()
    remove(data)
    assert_only_error(data, path, "is required")


def test_a_missing_handler_name_and_tool_are_reported() -> None:
    errors = errors_of(one_step(on_error=[{}]))
    assert errors == [(f"{HANDLER}.name", "is required"), (f"{HANDLER}.tool", "is required")]


@pytest.mark.parametrize(
    ("data", "path"),
    [
        (plan(agents=[]), "agents"),
        (plan(agent("a1", tasks=[])), "agents[0].tasks"),
        (plan(agent("a1", task("t1", steps=[]))), "agents[0].tasks[0].steps"),
    ],
    ids=["agents", "tasks", "steps"],
)
def test_an_empty_list_of_children_is_refused(data: dict[str, Any], path: str) -> None:
    assert_only_error(data, path, "must not be empty")


@pytest.mark.parametrize(
    ("agents", "got"), [(None, "null"), ({}, "an object"), ("a1", "a string"), (3, "a number")]
)
def test_a_list_of_children_of_the_wrong_type_is_refused(agents: Any, got: str) -> None:
    assert_only_error(plan(agents=agents), "agents", f"must be a non-empty list, got {got}")


def test_empty_objects_among_children_report_their_missing_fields() -> None:
    assert errors_of(plan(agents=[{}])) == [
        ("agents[0].name", "is required"),
        ("agents[0].tasks", "is required"),
    ]
    assert errors_of(plan(agent("a1", tasks=[{}]))) == [
        ("agents[0].tasks[0].name", "is required"),
        ("agents[0].tasks[0].steps", "is required"),
    ]


@pytest.mark.parametrize(
    ("data", "path", "fragment"),
    [
        (plan(agents=["a1"]), "agents[0]", "must be an object, got a string"),
        (plan(agent("a1", tasks=[None])), "agents[0].tasks[0]", "must be an object, got null"),
        (plan(agent("a1", task("t1", steps=[5]))), STEP, "must be an object, got a number"),
        (plan(agent("a1", task("t1", steps=[[]]))), STEP, "must be an object, got a list"),
        (one_step(on_error=[7]), HANDLER, "must be an object, got a number"),
        (one_step(on_error={}), f"{STEP}.on_error", "must be a list of steps, got an object"),
        (one_step(on_error=None), f"{STEP}.on_error", "must be a list of steps, got null"),
        (one_step(params=[]), f"{STEP}.params", "must be an object, got a list"),
        (one_step(params="url"), f"{STEP}.params", "must be an object, got a string"),
        (one_step(retry=[]), f"{STEP}.retry", "must be an object, got a list"),
        (one_step(retry=None), f"{STEP}.retry", "must be an object, got null"),
        (one_step(when=5), f"{STEP}.when", "must be a non-empty expression string"),
        (one_step(when="  "), f"{STEP}.when", "must be a non-empty expression string"),
        (plan(timeouts=["30s"]), "timeouts", "must be an object, got a list"),
        (plan(mode=["dag"]), "mode", 'must be one of sequential, parallel, dag, got ["dag"]'),
        (
            plan(agent("a1", task("t1", steps=5))),
            "agents[0].tasks[0].steps",
            "must be a non-empty list, got a number",
        ),
        (
            one_step(on_error=[{"name": ["h1"], "tool": "noop"}]),
            f"{HANDLER}.name",
            "must be a string, got a list",
        ),
    ],
)
def test_values_of_the_wrong_type_are_reported_not_crashed_on(
    data: dict[str, Any], path: str, fragment: str
) -> None:
    assert_only_error(data, path, fragment)


# --------------------------------------------------------------------------- unknown fields
@pytest.mark.parametrize(
    ("data", "path", "suggestion"),
    [
        (plan(prioirty=3), "prioirty", "did you mean 'priority'?"),
        (plan(agent("a1", depend_on=[])), "agents[0].depend_on", "did you mean 'depends_on'?"),
        (
            plan(agent("a1", task("t1", depend_on=[]))),
            "agents[0].tasks[0].depend_on",
            "did you mean 'depends_on'?",
        ),
        (one_step(depend_on=[]), f"{STEP}.depend_on", "did you mean 'depends_on'?"),
        (one_step(param={}), f"{STEP}.param", "did you mean 'params'?"),
        (with_handler(prams={}), f"{HANDLER}.prams", "did you mean 'params'?"),
        (
            one_step(retry={"max_attempt": 2}),
            f"{STEP}.retry.max_attempt",
            "did you mean 'max_attempts'?",
        ),
        (plan(timeouts={"stepp": "1s"}), "timeouts.stepp", "did you mean 'step'?"),
    ],
    ids=["run", "agent", "task", "step", "step-params", "handler", "retry", "timeouts"],
)
def test_an_unknown_field_is_refused_at_every_level(
    data: dict[str, Any], path: str, suggestion: str
) -> None:
    assert_only_error(data, path, f"unknown field; {suggestion}")


def test_an_unknown_field_with_no_near_miss_lists_the_allowed_fields() -> None:
    assert_only_error(
        one_step(colour="red"),
        f"{STEP}.colour",
        "unknown field; allowed: name, tool, params, when, retry, timeout, depends_on, on_error",
    )


@pytest.mark.parametrize("key", ["depends_on", "on_error"])
def test_a_handler_cannot_have_dependencies_or_handlers_of_its_own(key: str) -> None:
    assert_only_error(with_handler(**{key: []}), f"{HANDLER}.{key}", "unknown field")


# --------------------------------------------------------------------------- names
@pytest.mark.parametrize(
    ("name", "fragment"),
    [
        ("", "must not be empty"),
        ("has space", "'has space' is not a valid name"),
        ("x" * 101, "is 101 characters long; at most 100"),
        ("-leading", "'-leading' is not a valid name"),
        ("trailing\n", "is not a valid name"),
        ("naïve", "is not a valid name"),
        ("a/b", "is not a valid name"),
        (5, "must be a string, got a number"),
        (None, "must be a string, got null"),
        (["a"], "must be a string, got a list"),
    ],
)
def test_a_bad_step_name_is_refused(name: Any, fragment: str) -> None:
    assert_only_error(plan(agent("a1", task("t1", step(name)))), f"{STEP}.name", fragment)


@pytest.mark.parametrize(
    ("data", "path"),
    [
        (plan(agent("bad name")), "agents[0].name"),
        (plan(agent("a1", task("bad name"))), "agents[0].tasks[0].name"),
        (plan(agent("a1", task("t1", step("bad name")))), f"{STEP}.name"),
        (one_step(on_error=[step("bad name")]), f"{HANDLER}.name"),
    ],
    ids=["agent", "task", "step", "handler"],
)
def test_bad_names_are_refused_at_every_level(data: dict[str, Any], path: str) -> None:
    assert_only_error(data, path, "'bad name' is not a valid name")


def test_a_run_name_is_free_text_for_people_but_bounded() -> None:
    assert valid(plan(name="Market research: AI chips (Q3)")).name.startswith("Market")
    assert_only_error(plan(name="tab\there"), "name", "must be printable text")
    assert_only_error(plan(name="x" * 201), "name", "is 201 characters long; at most 200")
    assert_only_error(plan(name="   "), "name", "must not be empty")


@pytest.mark.parametrize("name", ["a", "9lives", "fetch-data_v2.1", "X" * 100])
def test_good_names_are_accepted(name: str) -> None:
    assert the_step(valid(plan(agent("a1", task("t1", step(name)))))).name == name


@pytest.mark.parametrize(
    ("data", "path", "message"),
    [
        (
            plan(agent("dup"), agent("other"), agent("dup")),
            "agents[2].name",
            "duplicate agent name 'dup' (also agents[0])",
        ),
        (
            plan(agent("a1", task("dup"), task("dup"))),
            "agents[0].tasks[1].name",
            "duplicate task name 'dup' (also tasks[0])",
        ),
        (
            plan(agent("a1", task("t1", step("dup"), step("dup")))),
            "agents[0].tasks[0].steps[1].name",
            "duplicate step name 'dup' (also steps[0])",
        ),
        (
            one_step(on_error=[step("dup"), step("dup")]),
            f"{STEP}.on_error[1].name",
            "duplicate handler name 'dup' (also on_error[0])",
        ),
    ],
    ids=["agents", "tasks", "steps", "handlers"],
)
def test_a_duplicate_name_is_reported_at_the_later_entry(
    data: dict[str, Any], path: str, message: str
) -> None:
    assert errors_of(data) == [(path, message)]


def test_the_same_name_under_different_parents_is_fine() -> None:
    valid(plan(agent("a1", task("t1", step("same")), task("t2", step("same")))))


# --------------------------------------------------------------------------- tools
def test_an_unknown_tool_is_reported_with_the_known_tools() -> None:
    errors = errors_of(one_step(tool="htp"))
    assert [path for path, _ in errors] == [f"{STEP}.tool"]
    message = errors[0][1]
    assert message.startswith("unknown tool 'htp'; did you mean 'http'?; known: ")
    assert "approval, callback, echo, fail, http, llm, noop, poll, python, run, runner" in message


@pytest.mark.parametrize(("tool", "got"), [(None, "null"), (["http"], "a list"), (1, "a number")])
def test_a_tool_that_is_not_a_name_is_refused(tool: Any, got: str) -> None:
    assert_only_error(one_step(tool=tool), f"{STEP}.tool", f"must be a tool name, got {got}")


def test_the_approval_tool_is_refused_inside_on_error() -> None:
    assert_only_error(
        with_handler(tool="approval"),
        f"{HANDLER}.tool",
        "'approval' cannot be used in an on_error handler",
    )


def test_the_approval_tool_is_fine_as_an_ordinary_step() -> None:
    assert the_step(valid(one_step(tool="approval"))).tool == "approval"


# --------------------------------------------------------------------------- dependencies
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


def dag_of_steps(**depends: list[str]) -> dict[str, Any]:
    steps = [step(name, depends_on=deps) if deps else step(name) for name, deps in depends.items()]
    return plan(agent("a1", task("t1", *steps, mode="dag")))


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


# --------------------------------------------------------------------------- durations
BAD_DURATIONS: list[Any] = ["30x", "-5s", "0s", "0.5ms", "", "30", "5 mins", "1e3s", "9" * 20 + "s"]
BAD_DURATIONS += [True, False, None, [], {}, -1, 0, 0.0001]
DURATION_PLACES = {
    "timeouts.run": lambda value: plan(timeouts={"run": value}),
    "timeouts.step": lambda value: plan(timeouts={"step": value}),
    "agents[0].timeout": lambda value: plan(agent("a1", timeout=value)),
    "agents[0].tasks[0].timeout": lambda value: plan(agent("a1", task("t1", timeout=value))),
    f"{STEP}.timeout": lambda value: one_step(timeout=value),
    f"{HANDLER}.timeout": lambda value: with_handler(timeout=value),
}


@pytest.mark.parametrize("value", BAD_DURATIONS, ids=repr)
@pytest.mark.parametrize("path", list(DURATION_PLACES))
def test_a_malformed_duration_is_refused(path: str, value: Any) -> None:
    assert_only_error(
        DURATION_PLACES[path](value), path, "must be a duration of at least 1ms such as '250ms'"
    )


@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan")], ids=repr)
@pytest.mark.parametrize("path", list(DURATION_PLACES))
def test_a_duration_that_is_not_a_json_number_is_refused_as_such(path: str, value: Any) -> None:
    assert_only_error(DURATION_PLACES[path](value), path, "NaN and Infinity are not JSON numbers")


@pytest.mark.parametrize(
    ("value", "ms"),
    [
        ("250ms", 250),
        ("30s", 30_000),
        ("5m", 300_000),
        ("1.5h", 5_400_000),
        ("7d", 604_800_000),
        (" 2 s ", 2000),
        ("1.0005s", 1000),
        (30, 30_000),
        (0.25, 250),
        (1.5, 1500),
    ],
)
def test_a_duration_is_converted_to_milliseconds(value: Any, ms: int) -> None:
    assert parse_duration_ms(value) == ms
    assert valid(plan(timeouts={"run": value})).timeouts_ms == {"run": ms}


@pytest.mark.parametrize(
    "value", [float("inf"), float("nan"), "9" * 400 + "s", 1e-9, {"s": 1}, "30s\nx", "٣s"]
)
def test_parse_duration_ms_refuses_oddities_without_raising(value: Any) -> None:
    assert parse_duration_ms(value) is None


def test_a_step_timeout_over_the_maximum_is_refused() -> None:
    small = limits(max_step_timeout_ms=60_000)
    assert_only_error(one_step(timeout="2m"), f"{STEP}.timeout", "must be at most 1m", small)
    assert_only_error(plan(timeouts={"step": 61}), "timeouts.step", "must be at most 1m", small)
    assert the_step(valid(one_step(timeout="1m"), small)).timeout_ms == 60_000


def test_a_duration_longer_than_a_year_is_refused() -> None:
    assert_only_error(plan(timeouts={"run": "366d"}), "timeouts.run", "must be at most 365d")
    assert_only_error(plan(timeouts={"run": 1e300}), "timeouts.run", "must be at most 365d")


# --------------------------------------------------------------------------- enums, integers
@pytest.mark.parametrize(
    ("data", "path", "fragment"),
    [
        (
            plan(mode="dga"),
            "mode",
            "must be one of sequential, parallel, dag, got 'dga'; did you mean 'dag'?",
        ),
        (plan(agent("a1", mode="serial")), "agents[0].mode", "got 'serial'"),
        (plan(agent("a1", task("t1", mode=1))), "agents[0].tasks[0].mode", "got 1"),
        (plan(failure_mode="fail_fast"), "failure_mode", "did you mean 'fail-fast'?"),
        (plan(agent("a1", failure_mode="ignore")), "agents[0].failure_mode", "got 'ignore'"),
        (
            plan(agent("a1", task("t1", failure_mode=None))),
            "agents[0].tasks[0].failure_mode",
            "must be one of fail-fast, continue, retry, got null",
        ),
        (
            one_step(retry={"backoff": "expo"}),
            f"{STEP}.retry.backoff",
            "must be one of fixed, linear, exponential, got 'expo'",
        ),
    ],
)
def test_a_bad_enum_value_is_refused(data: dict[str, Any], path: str, fragment: str) -> None:
    assert_only_error(data, path, fragment)


@pytest.mark.parametrize(
    ("data", "path", "fragment"),
    [
        (plan(priority=10), "priority", "must be an integer from 0 to 9, got 10"),
        (plan(priority=-1), "priority", "got -1"),
        (plan(priority="5"), "priority", "got '5'"),
        (plan(priority=5.0), "priority", "got 5.0"),
        (plan(priority=True), "priority", "got true"),
        (plan(max_attempts=0), "max_attempts", "must be an integer from 1 to 10, got 0"),
        (plan(max_agents=0), "max_agents", "must be an integer from 1 to 100, got 0"),
        (
            plan(agent("a1", max_concurrent_tasks=10_001)),
            "agents[0].max_concurrent_tasks",
            "must be an integer from 1 to 10000, got 10001",
        ),
        (
            plan(agent("a1", task("t1", max_concurrent_steps=0))),
            "agents[0].tasks[0].max_concurrent_steps",
            "must be an integer from 1 to 10000, got 0",
        ),
        (
            plan(agent("a1", task("t1", max_concurrent_steps=False))),
            "agents[0].tasks[0].max_concurrent_steps",
            "got false",
        ),
        (
            one_step(retry={"max_attempts": 0}),
            f"{STEP}.retry.max_attempts",
            "must be an integer from 1 to 20, got 0",
        ),
        (one_step(retry={"max_failures": 21}), f"{STEP}.retry.max_failures", "got 21"),
        (one_step(retry={"base_delay_ms": -1}), f"{STEP}.retry.base_delay_ms", "got -1"),
    ],
)
def test_an_integer_out_of_range_or_of_the_wrong_type_is_refused(
    data: dict[str, Any], path: str, fragment: str
) -> None:
    assert_only_error(data, path, fragment)


def test_the_default_max_agents_respects_a_lower_limit() -> None:
    assert valid(plan(), limits(max_agents=3)).max_agents == 3


# --------------------------------------------------------------------------- retry policy
@pytest.mark.parametrize(
    ("retry", "path", "fragment"),
    [
        (
            {"base_delay_ms": 5000, "max_delay_ms": 1000},
            "max_delay_ms",
            "must be at least base_delay_ms (5000), got 1000",
        ),
        (
            {"retry_on": ["timout"]},
            "retry_on[0]",
            "unknown error code 'timout'; did you mean 'timeout'?",
        ),
        ({"retry_on": [5]}, "retry_on[0]", "unknown error code 5"),
        ({"retry_on": [["timeout"]]}, "retry_on[0]", 'unknown error code ["timeout"]'),
        ({"retry_on": ["auth_error"]}, "retry_on[0]", "'auth_error' is never retried"),
        ({"retry_on": "timeout"}, "retry_on", "must be a list of error codes, got a string"),
        ({"jitter": 1.5}, "jitter", "must be a number from 0.0 to 1.0, got 1.5"),
        ({"jitter": -0.1}, "jitter", "got -0.1"),
        ({"jitter": True}, "jitter", "got true"),
        ({"multiplier": 0.5}, "multiplier", "must be a number from 1.0 to 10.0, got 0.5"),
        ({"multiplier": float("nan")}, "multiplier", "NaN and Infinity are not JSON numbers"),
    ],
)
def test_a_retry_policy_problem_is_refused(retry: dict[str, Any], path: str, fragment: str) -> None:
    assert_only_error(one_step(retry=retry), f"{STEP}.retry.{path}", fragment)


def test_a_retry_policy_is_normalised_with_defaults() -> None:
    policy = the_step(
        valid(one_step(retry={"max_attempts": 5, "retry_on": ["timeout", "timeout"]}))
    ).retry
    assert policy == RetryPolicy(max_attempts=5, max_failures=5, retry_on=("timeout",))
    assert the_step(valid(one_step())).retry == RetryPolicy()
    assert the_step(valid(one_step(retry={"base_delay_ms": 60_000}))).retry.max_delay_ms == 60_000


# --------------------------------------------------------------------------- credits
@pytest.mark.parametrize(
    "credits",
    [
        -1,
        0,
        0.0,
        "0",
        "abc",
        "",
        "-5",
        "1e3",
        "NaN",
        True,
        None,
        [],
        {},
        1.1234567,
        "1.1234567",
        10**12,
    ],
    ids=repr,
)
def test_bad_credits_are_refused(credits: Any) -> None:
    assert_only_error(
        plan(credits=credits),
        "credits",
        "must be a positive number below 1000000000000 with at most 6 decimals",
    )


@pytest.mark.parametrize(
    ("credits", "expected"),
    [
        (500, Decimal("500")),
        ("12.5", Decimal("12.5")),
        (0.25, Decimal("0.25")),
        (0.000001, Decimal("0.000001")),
        ("999999999999.999999", Decimal("999999999999.999999")),
    ],
)
def test_valid_credits_become_a_decimal(credits: Any, expected: Decimal) -> None:
    result = valid(plan(credits=credits))
    assert isinstance(result.credits, Decimal)
    assert result.credits == expected


def test_a_number_too_long_for_json_is_refused_not_crashed_on() -> None:
    huge = 10**5000  # Python's json refuses ints of more than 4,300 digits
    assert errors_of(plan(credits=huge)) == [("", "plan cannot be written as JSON")]
    with pytest.raises(PlanInvalid) as caught:  # the API passes the body's size instead
        parse_plan(plan(credits=huge), size_hint=100)
    assert [error.path for error in caught.value.errors] == ["credits"]


def test_credits_are_none_when_omitted() -> None:
    assert valid(plan()).credits is None


# --------------------------------------------------------------------------- variables
@pytest.mark.parametrize(
    ("variables", "got"), [([], "a list"), ("topic", "a string"), (None, "null")]
)
def test_variables_must_be_an_object(variables: Any, got: str) -> None:
    assert_only_error(plan(variables=variables), "variables", f"must be an object, got {got}")


def test_variables_over_the_size_limit_are_refused() -> None:
    small = limits(max_variables_bytes=50)
    assert_only_error(
        plan(variables={"topic": "x" * 50}),
        "variables",
        "must be at most 50 bytes as JSON, got 62",
        small,
    )
    assert valid(plan(variables={"topic": "x" * 30}), small).variables == {"topic": "x" * 30}


# --------------------------------------------------------------------------- templates
@pytest.mark.parametrize(
    ("params", "path", "fragment"),
    [
        ({"url": "https://x.invalid/?q=${variables.topic"}, "url", "bad template: unclosed '${'"),
        ({"url": "${}"}, "url", "bad template: empty reference '${}'"),
        ({"url": "${ }"}, "url", "bad template: empty reference '${}'"),
        ({"url": "${variables.}"}, "url", "bad template: expected a name after '.'"),
        ({"url": "${variables[-1]}"}, "url", "list indexes must be non-negative"),
        ({"headers": {"Authorization": "Bearer ${"}}, "headers.Authorization", "unclosed '${'"),
        ({"items": ["ok", "${}"]}, "items[1]", "empty reference"),
    ],
)
def test_a_bad_template_is_reported_at_its_param_path(
    params: dict[str, Any], path: str, fragment: str
) -> None:
    assert_only_error(one_step(params=params), f"{STEP}.params.{path}", fragment)


def test_a_template_index_too_long_for_python_is_refused_not_crashed_on() -> None:
    data = one_step(params={"url": "${variables.list[" + "9" * 5000 + "]}"})
    assert_only_error(data, f"{STEP}.params.url", "bad template: a list index is too long")


def test_every_bad_string_in_params_is_reported() -> None:
    data = one_step(params={"a": "${", "b": "${variables.nope}", "c": ["${}"], "d": "$${fine}"})
    assert [path for path, _ in errors_of(data)] == [
        f"{STEP}.params.a",
        f"{STEP}.params.b",
        f"{STEP}.params.c[0]",
    ]


def reference_plan() -> dict[str, Any]:
    """An agent in dag mode whose tasks cover every way a step can see another.

    fetch (sequential): first, second
    parse (parallel, after fetch): left, right
    report (dag, after parse): collect; merge after collect; publish after merge; aside
    other (no dependencies): lone
    """
    return plan(
        agent(
            "a1",
            task("fetch", step("first"), step("second")),
            task("parse", step("left"), step("right"), mode="parallel", depends_on=["fetch"]),
            task(
                "report",
                step("collect"),
                step("merge", depends_on=["collect"]),
                step("publish", depends_on=["merge"]),
                step("aside"),
                mode="dag",
                depends_on=["parse"],
            ),
            task("other", step("lone")),
            mode="dag",
        ),
        variables={"topic": "otters", "a key": 1},
    )


TASKS = {"fetch": 0, "parse": 1, "report": 2, "other": 3}
STEPS = {
    "first": 0,
    "second": 1,
    "left": 0,
    "right": 1,
    "collect": 0,
    "merge": 1,
    "publish": 2,
    "aside": 3,
    "lone": 0,
}


def place(
    text: str, task_name: str, step_name: str, *, field: str = "params", handler: bool = False
) -> tuple[dict[str, Any], str]:
    """``reference_plan()`` with ``text`` put in one step's params (or condition), and
    the path where problems with it are reported."""
    data = reference_plan()
    target = data["agents"][0]["tasks"][TASKS[task_name]]["steps"][STEPS[step_name]]
    path = f"agents[0].tasks[{TASKS[task_name]}].steps[{STEPS[step_name]}]"
    if handler:
        target["on_error"] = [{"name": "cleanup", "tool": "noop"}]
        target = target["on_error"][0]
        path += ".on_error[0]"
    if field == "params":
        target["params"] = {"value": text}
        return data, f"{path}.params.value"
    target["when"] = text
    return data, f"{path}.when"


NOT_FINISHED = "is not guaranteed to finish before this"
REFUSED_REFERENCES = [
    pytest.param(
        "fetch", "first", "${steps.second.output}", NOT_FINISHED, id="later-sequential-step"
    ),
    pytest.param("fetch", "first", "${steps.first.output}", NOT_FINISHED, id="the-step-itself"),
    pytest.param("parse", "left", "${steps.right.status}", NOT_FINISHED, id="parallel-sibling"),
    pytest.param("report", "merge", "${steps.aside.output}", NOT_FINISHED, id="dag-non-dependency"),
    pytest.param("report", "collect", "${steps.publish.output}", NOT_FINISHED, id="dag-dependent"),
    pytest.param(
        "fetch", "second", "${tasks.parse.status}", "task 'parse' " + NOT_FINISHED, id="later-task"
    ),
    pytest.param(
        "parse",
        "left",
        "${tasks.other.status}",
        "task 'other' " + NOT_FINISHED,
        id="dag-non-dependency-task",
    ),
    pytest.param(
        "fetch",
        "second",
        "${tasks.fetch.steps.first.output}",
        "reads its own task's steps as steps.<step>",
        id="own-task",
    ),
    pytest.param(
        "parse",
        "left",
        "${steps.first.output}",
        "unknown step 'first' in ${steps.first.output}; it is a step of task 'fetch'",
        id="other-task-step-short-form",
    ),
    pytest.param(
        "fetch",
        "second",
        "${variables.nope}",
        "unknown variable 'nope' in ${variables.nope} (known: a key, topic)",
        id="unknown-variable",
    ),
    pytest.param("fetch", "second", "${variables}", "name a variable", id="bare-variables"),
    pytest.param(
        "fetch", "second", "${steps.nope.output}", "unknown step 'nope'", id="unknown-step"
    ),
    pytest.param(
        "fetch",
        "second",
        "${steps.first}",
        "use steps.<step>.(output|status|error|attempts|cost)",
        id="step-without-field",
    ),
    pytest.param(
        "fetch", "second", "${steps.first.result}", "use steps.<step>.(output", id="step-bad-field"
    ),
    pytest.param("parse", "left", "${tasks.nope.status}", "unknown task 'nope'", id="unknown-task"),
    pytest.param(
        "parse",
        "left",
        "${tasks.fetch}",
        "use tasks.<task>.status or tasks.<task>.steps",
        id="bare-task",
    ),
    pytest.param(
        "parse", "left", "${tasks.fetch.output}", "use tasks.<task>.status", id="task-bad-field"
    ),
    pytest.param(
        "parse",
        "left",
        "${tasks.fetch.steps.nope.output}",
        "unknown step 'nope'",
        id="unknown-step-of-task",
    ),
    pytest.param(
        "fetch",
        "second",
        "${error.code}",
        "'error' is only available in on_error handlers",
        id="error-outside-handler",
    ),
    pytest.param(
        "fetch",
        "second",
        "${run.nope}",
        "run exposes id, name, attempt, priority",
        id="run-bad-field",
    ),
    pytest.param(
        "fetch",
        "second",
        "${nope.key}",
        "unknown root 'nope'; use variables, run, step, steps, tasks, error or callback",
        id="unknown-root",
    ),
    pytest.param(
        "fetch", "second", "${step.output}", "step exposes id, name, attempt", id="step-bad-field"
    ),
]
ALLOWED_REFERENCES = [
    pytest.param("fetch", "second", "${run.id}-${step.id}-${step.attempt}", id="current-step"),
    pytest.param("fetch", "second", "${steps.first.output.items[0]}", id="earlier-sequential-step"),
    pytest.param("report", "merge", "${steps.collect.status}", id="dag-dependency"),
    pytest.param("report", "publish", "${steps.collect.output}", id="transitive-dag-dependency"),
    pytest.param(
        "parse", "left", "${tasks.fetch.steps.second.output.body}", id="earlier-task-step"
    ),
    pytest.param("report", "collect", "${tasks.fetch.status}", id="transitive-task-dependency"),
    pytest.param(
        "fetch",
        "first",
        "${variables.topic} for ${run.name} #${run.attempt}",
        id="variables-and-run",
    ),
    pytest.param("fetch", "first", '${variables["a key"]}', id="quoted-variable"),
    pytest.param("fetch", "first", "costs $5, not $${variables.nope}", id="escaped"),
]


@pytest.mark.parametrize(("task_name", "step_name", "text", "fragment"), REFUSED_REFERENCES)
def test_a_template_reference_that_cannot_resolve_is_refused(
    task_name: str, step_name: str, text: str, fragment: str
) -> None:
    data, path = place(text, task_name, step_name)
    assert_only_error(data, path, fragment)


@pytest.mark.parametrize(("task_name", "step_name", "text"), ALLOWED_REFERENCES)
def test_a_template_reference_to_finished_work_is_accepted(
    task_name: str, step_name: str, text: str
) -> None:
    valid(place(text, task_name, step_name)[0])


def test_the_reference_plan_itself_is_valid() -> None:
    result = valid(reference_plan())
    assert result.agents[0].tasks[2].steps[2].depends_on == ("merge",)
    assert [t.depends_on for t in result.agents[0].tasks] == [(), ("fetch",), ("parse",), ()]


@pytest.mark.parametrize(
    "text",
    [
        "${error.code}",
        "${error.message} in ${error.step}",
        "${steps.first.error}",
        "${steps.first.attempts}",
    ],
)
def test_a_handler_may_read_the_error_and_its_failed_step(text: str) -> None:
    valid(place(text, "fetch", "first", handler=True)[0])


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("${error.nope}", "error exposes code, message, step, retryable"),
        ("${error}", "error exposes"),
        ("${steps.second.output}", "step 'second' " + NOT_FINISHED),
    ],
)
def test_a_handler_reference_is_still_checked(text: str, fragment: str) -> None:
    data, path = place(text, "fetch", "first", handler=True)
    assert_only_error(data, path, fragment)


def test_a_reference_to_a_task_of_another_agent_is_unknown() -> None:
    data = plan(
        agent("a1", task("t1", step("s1"))),
        agent("a2", task("t2", step("s2", params={"x": "${tasks.t1.status}"}))),
    )
    assert_only_error(data, "agents[1].tasks[0].steps[0].params.x", "unknown task 't1'")


# --------------------------------------------------------------------------- conditions
@pytest.mark.parametrize(
    ("when", "fragment"),
    [
        ("${tasks.fetch.status} = 'completed'", "use '==' to compare"),
        ("(${run.attempt} > 1", "expected ')' to close"),
        ("status == 'ok'", "unknown name 'status'"),
        ("True", "use 'true'"),
        ("${run.attempt} > 1 > 0", "comparisons cannot be chained"),
        ("${}", "empty reference"),
        ("len(${run.name})", "unknown name 'len'"),
    ],
)
def test_a_condition_with_bad_syntax_is_refused(when: str, fragment: str) -> None:
    data, path = place(when, "fetch", "second", field="when")
    errors = errors_of(data)
    assert [p for p, _ in errors] == [path]
    assert errors[0][1].startswith("bad condition: ")
    assert fragment in errors[0][1]


@pytest.mark.parametrize(("task_name", "step_name", "text", "fragment"), REFUSED_REFERENCES)
def test_a_condition_reference_is_checked_like_a_template(
    task_name: str, step_name: str, text: str, fragment: str
) -> None:
    data, path = place(f"{text} != null", task_name, step_name, field="when")
    assert_only_error(data, path, fragment)


@pytest.mark.parametrize(
    "when",
    [
        "${steps.first.status} == 'completed'",
        "${variables.topic} in ['otters', 'seals'] and not ${run.attempt} > 2",
        "true",
    ],
)
def test_a_condition_with_valid_references_is_accepted(when: str) -> None:
    data, _ = place(when, "fetch", "second", field="when")
    assert the_step(valid(data), 0, 1).when == when


def test_a_handler_condition_may_read_the_error() -> None:
    valid(place("${error.code} == 'timeout'", "fetch", "first", field="when", handler=True)[0])


# --------------------------------------------------------------------------- size limits
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


# --------------------------------------------------------------------------- valid plans
def spec_example() -> dict[str, Any]:
    """SPEC section 3's example, with real tools and no placeholders."""
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


def test_the_spec_example_validates_and_is_normalised() -> None:
    result = valid(spec_example())
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
    run = run_create(organization=organization, plan=spec_example())
    assert (Run.objects.count(), HistoryEvent.objects.count()) == (runs + 1, events + 1)
    run.refresh_from_db()
    assert (run.name, run.priority, run.plan) == ("market-research", 5, spec_example())


# --------------------------------------------------------------------------- property
KEYS = sorted(
    {
        "name", "priority", "failure_mode", "mode", "max_attempts", "credits", "variables",
        "timeouts", "max_agents", "agents", "tasks", "steps", "tool", "params", "when",
        "retry", "timeout", "depends_on", "on_error", "max_concurrent_tasks",
        "max_concurrent_steps", "retry_on", "jitter", "backoff", "run", "step",
    }
)  # fmt: skip
STRINGS = [
    "a", "b", "noop", "http", "approval", "dag", "parallel", "30s", "-5s", "fail-fast",
    "timeout", "${variables.topic}", "${steps.a.output}", "${tasks.b.status}", "${error.code}",
    "${", "${}", "$${x}", "${steps.a.status} == 'completed'", "(", "x ==", "1e400s",
]  # fmt: skip

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(max_size=8)
    | st.sampled_from(STRINGS),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=4), children, max_size=5)
    ),
    max_leaves=25,
)


def sometimes_anything(sensible: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly a sensible value, one time in ten any JSON value at all."""
    return st.integers(0, 9).flatmap(lambda n: json_values if n == 0 else sensible)


name_values = sometimes_anything(st.sampled_from(["a", "b", "c", "bad name", ""]))
name_lists = sometimes_anything(st.lists(st.sampled_from(["a", "b", "c", "z"]), max_size=3))
modes = sometimes_anything(st.sampled_from(["sequential", "parallel", "dag"]))
durations = sometimes_anything(st.sampled_from(["30s", "1.5h", 5, 0.5, "0s", "30x"]))
texts = sometimes_anything(st.sampled_from(STRINGS))
retries = sometimes_anything(
    st.fixed_dictionaries(
        {},
        optional={
            "max_attempts": sometimes_anything(st.integers(0, 25)),
            "base_delay_ms": sometimes_anything(st.integers(0, 5000)),
            "max_delay_ms": sometimes_anything(st.integers(0, 5000)),
            "retry_on": sometimes_anything(
                st.lists(st.sampled_from(["timeout", "auth_error", "x"]))
            ),
            "jitter": sometimes_anything(st.floats()),
        },
    )
)
handler_fields = {
    "params": sometimes_anything(st.dictionaries(st.sampled_from(["url", "body"]), texts)),
    "when": texts,
    "retry": retries,
    "timeout": durations,
}
handler_values = sometimes_anything(
    st.fixed_dictionaries(
        {
            "name": name_values,
            "tool": sometimes_anything(st.sampled_from(["noop", "approval", "x"])),
        },
        optional=handler_fields,
    )
)
step_values = sometimes_anything(
    st.fixed_dictionaries(
        {"name": name_values, "tool": sometimes_anything(st.sampled_from(["noop", "http", "x"]))},
        optional={
            **handler_fields,
            "depends_on": name_lists,
            "on_error": sometimes_anything(st.lists(handler_values, max_size=2)),
        },
    )
)
task_values = sometimes_anything(
    st.fixed_dictionaries(
        {
            "name": name_values,
            "steps": sometimes_anything(st.lists(step_values, min_size=1, max_size=3)),
        },
        optional={"mode": modes, "depends_on": name_lists, "timeout": durations},
    )
)
agent_values = sometimes_anything(
    st.fixed_dictionaries(
        {
            "name": name_values,
            "tasks": sometimes_anything(st.lists(task_values, min_size=1, max_size=3)),
        },
        optional={"mode": modes, "depends_on": name_lists},
    )
)
plan_values = st.fixed_dictionaries(
    {
        "name": name_values,
        "agents": sometimes_anything(st.lists(agent_values, min_size=1, max_size=2)),
    },
    optional={
        "mode": modes,
        "priority": sometimes_anything(st.integers(-1, 10)),
        "credits": sometimes_anything(st.decimals(allow_nan=False).map(str)),
        "variables": sometimes_anything(
            st.dictionaries(st.sampled_from(["topic", "n"]), json_values)
        ),
        "timeouts": sometimes_anything(
            st.dictionaries(st.sampled_from(["run", "step", "x"]), durations)
        ),
    },
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(json_values, plan_values))
def test_any_json_input_gives_a_plan_or_plan_invalid(data: Any) -> None:
    outcome: Plan | PlanInvalid
    try:
        outcome = parse_plan(data)
    except PlanInvalid as exc:  # anything else fails the test
        outcome = exc
    if isinstance(outcome, PlanInvalid):
        assert outcome.errors
        assert all(isinstance(e.path, str) and e.message for e in outcome.errors)
    else:
        assert outcome.step_count >= 1


# --------------------------------------------------------------------------- storable values
@pytest.mark.parametrize(
    ("data", "path", "fragment"),
    [
        (one_step(params={"q": "a\x00b"}), f"{STEP}.params.q", "contains a NUL character"),
        (one_step(params={"q": "\ud800"}), f"{STEP}.params.q", "contains an unpaired surrogate"),
        (one_step(params={"n": float("nan")}), f"{STEP}.params.n", "NaN and Infinity"),
        (one_step(params={"n": float("inf")}), f"{STEP}.params.n", "NaN and Infinity"),
        (one_step(params={"n": [1, float("-inf")]}), f"{STEP}.params.n[1]", "NaN and Infinity"),
        (plan(variables={"v": "x\x00"}), "variables.v", "contains a NUL character"),
        (plan(variables={"v": float("nan")}), "variables.v", "NaN and Infinity"),
        (plan(variables={"v": float("inf")}), "variables.v", "NaN and Infinity"),
        (plan(variables={"v": {"w": float("-inf")}}), "variables.v.w", "NaN and Infinity"),
        ({**plan(), "name": "bad\x00name"}, "name", "contains a NUL character"),
    ],
    ids=[
        "nul",
        "surrogate",
        "nan",
        "infinity",
        "minus-infinity-in-list",
        "nul-variable",
        "nan-variable",
        "inf-variable",
        "minus-inf-nested-variable",
        "nul-name",
    ],
)
def test_values_postgresql_cannot_store_are_refused_with_their_path(
    data: Any, path: str, fragment: str
) -> None:
    assert_only_error(data, path, fragment)


def test_a_key_with_a_nul_character_is_refused() -> None:
    errors = errors_of(one_step(params={"a\x00b": 1}))

    assert len(errors) == 1
    assert errors[0][0].endswith("params.'a\\x00b'"), errors
    assert "key contains a NUL character" in errors[0][1]


def test_ordinary_floats_in_params_and_variables_are_accepted() -> None:
    data = one_step(params={"x": -1.5e300})
    data["variables"] = {"v": 0.1}

    result = valid(data)

    assert the_step(result).params == {"x": -1.5e300}
    assert result.variables == {"v": 0.1}


def test_every_unstorable_value_is_reported_at_once() -> None:
    data = one_step(params={"a": "\x00", "b": float("nan"), "c": "\udfff", "d\x00": 1})
    data["variables"] = {"v": "\x00"}

    errors = sorted(errors_of(data))

    assert errors == sorted(
        [
            ("variables.v", "contains a NUL character"),
            (f"{STEP}.params.a", "contains a NUL character"),
            (f"{STEP}.params.b", "NaN and Infinity are not JSON numbers"),
            (f"{STEP}.params.c", "contains an unpaired surrogate"),
            (f"{STEP}.params.'d\\x00'", "key contains a NUL character"),
        ]
    )


@pytest.mark.django_db
def test_the_service_refuses_such_a_plan_and_stores_nothing() -> None:
    organization = factories.org()
    with pytest.raises(PlanInvalid):
        run_create(organization=organization, plan=one_step(params={"q": "\x00"}))

    assert not Run.objects.filter(organization=organization).exists()
