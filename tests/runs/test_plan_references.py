"""What a plan's templates and conditions may read (runs/plan/): a `${...}` reference
that cannot resolve when its step runs (work not guaranteed to have finished, another
agent's task) is refused, one to finished work accepted; a handler may read the error and
its failed step; a `when` condition is parsed and its references checked alike."""

from __future__ import annotations

from typing import Any

import pytest

from tests.runs.plans import (
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
)


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
