"""The plan's shape (runs/plan/): what is not an object, a missing or unknown field, a
child list empty or of the wrong type, bad names and duplicates, unknown tools; each
reported once, at its path, with a message a client recognises."""

from __future__ import annotations

from typing import Any

import pytest

from tests.runs.plans import (
    HANDLER,
    STEP,
    agent,
    assert_only_error,
    errors_of,
    one_step,
    plan,
    step,
    task,
    the_step,
    valid,
    with_handler,
)


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
