"""Plans to test the plan with (runs/plan/): small builders of a valid plan to break one
thing of, the assertions on what ``parse_plan`` refuses, and Hypothesis strategies of any
JSON value and of JSON shaped like a plan, mostly sensible, sometimes anything."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import strategies as st

from runs.plan import Limits, Plan, PlanInvalid, parse_plan

STEP = "agents[0].tasks[0].steps[0]"
HANDLER = f"{STEP}.on_error[0]"


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


def dag_of_steps(**depends: list[str]) -> dict[str, Any]:
    """A plan of one `dag` task whose steps depend as ``depends`` says (name: its
    dependencies)."""
    steps = [step(name, depends_on=deps) if deps else step(name) for name, deps in depends.items()]
    return plan(agent("a1", task("t1", *steps, mode="dag")))


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
