"""The OpenAPI `Plan` schema and `parse_plan` agree, because both come from one model.

The schema is taken as clients see it: the `Plan` component of the document
drf-spectacular generates, validated with `jsonschema` (Draft 4: OpenAPI 3.0's boolean
`exclusiveMinimum`, and no float counts as an integer; 3.0's `nullable: true`, which
Draft 4 does not know, read as null being one more choice). Three properties over
generated plans:

- every well-formed plan (sequential, parallel and dag levels, retry policies, handlers,
  conditions, timeouts, variables, credits...) is accepted by both;
- every plan broken in one field (a wrong type, an unknown field, a number out of range,
  a required field missing) is refused by both: the schema is as strict as the model
  wherever JSON Schema can say it;
- for anything at all, a plan `parse_plan` accepts is valid under the schema (the schema
  is looser only where it cannot see: names, graphs, templates, sizes).

The shape of a plan is written out here a second time, on purpose: it is the contract
both must keep.
"""

from __future__ import annotations

import copy
from decimal import Decimal
from typing import Any

import pytest
from drf_spectacular.generators import SchemaGenerator
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jsonschema import Draft4Validator

from common.errors import RETRYABLE_CODES
from runs.plan import Limits, Plan, PlanInvalid, parse_plan
from tests.runs.plans import json_values, plan_values

LIMITS = Limits.from_settings()
TOOLS = ["noop", "echo"]
MODES = ["sequential", "parallel", "dag"]
FAILURE_MODES = ["fail-fast", "continue", "retry"]

# The contract: each kind of object, its fields and their JSON kinds.
FIELDS: dict[str, dict[str, str]] = {
    "plan": {
        "name": "string", "priority": "integer", "failure_mode": "enum", "mode": "enum",
        "max_attempts": "integer", "credits": "credits", "variables": "object",
        "timeouts": "object", "max_agents": "integer", "agents": "array",
    },
    "agent": {
        "name": "string", "mode": "enum", "failure_mode": "enum",
        "max_concurrent_tasks": "integer", "depends_on": "array", "timeout": "duration",
        "tasks": "array",
    },
    "task": {
        "name": "string", "mode": "enum", "failure_mode": "enum",
        "max_concurrent_steps": "integer", "depends_on": "array", "timeout": "duration",
        "steps": "array",
    },
    "step": {
        "name": "string", "tool": "enum", "params": "object", "when": "string",
        "retry": "object", "timeout": "duration", "depends_on": "array", "on_error": "array",
    },
    "handler": {
        "name": "string", "tool": "enum", "params": "object", "when": "string",
        "retry": "object", "timeout": "duration",
    },
    "retry": {
        "max_attempts": "integer", "max_failures": "integer", "backoff": "enum",
        "base_delay_ms": "integer", "max_delay_ms": "integer", "multiplier": "number",
        "jitter": "number", "retry_on": "array",
    },
    "timeouts": dict.fromkeys(
        ["run", "agent", "task", "step", "pending", "paused", "resuming", "retrying"], "duration"
    ),
}  # fmt: skip
REQUIRED = {
    "plan": ["name", "agents"],
    "agent": ["name", "tasks"],
    "task": ["name", "steps"],
    "step": ["name", "tool"],
    "handler": ["name", "tool"],
}
# Values of another JSON kind (or, for enums and formats, no allowed value).
WRONG: dict[str, list[Any]] = {
    "string": [5, None, True, [], {}],
    "integer": ["5", 5.5, 5.0, True, None, [], {}],
    "number": ["1", True, None, [], {}],
    "enum": [1, None, True, [], {}, "nope"],
    "object": [[], "x", 1, None, True],
    "array": [{}, "x", 1, None, True],
    "duration": [True, None, [], {}, "30x", "", 0, -1, "5 mins"],
    "credits": [True, None, [], {}, "abc", "-5", 0, -1, 10**12],
}
RANGES: dict[tuple[str, str], tuple[float, float]] = {
    ("plan", "priority"): (0, 9),
    ("plan", "max_attempts"): (1, 10),
    ("plan", "max_agents"): (1, LIMITS.max_agents),
    ("agent", "max_concurrent_tasks"): (1, 10_000),
    ("task", "max_concurrent_steps"): (1, 10_000),
    ("retry", "max_attempts"): (1, LIMITS.max_retry_attempts),
    ("retry", "max_failures"): (1, LIMITS.max_retry_attempts),
    ("retry", "base_delay_ms"): (0, 3_600_000),
    ("retry", "max_delay_ms"): (0, 3_600_000),
    ("retry", "multiplier"): (1.0, 10.0),
    ("retry", "jitter"): (0.0, 1.0),
}
UNKNOWN_KEYS = ["colour", "prioirty", "timeout_ms", "timeouts_ms", "Name", "x-extra"]


def json_schema(schema: Any) -> Any:
    """An OpenAPI 3.0 schema in JSON Schema's words: ``nullable: true`` (``X | None``)
    becomes ``anyOf: [X, {type: null}]``, as OpenAPI 3.1 and schemathesis say it; every
    other keyword the plan uses means the same in both."""
    if isinstance(schema, list):
        return [json_schema(part) for part in schema]
    if not isinstance(schema, dict):
        return schema
    # A bool: a property *named* "nullable" would have a schema as its value.
    result = {
        key: json_schema(value)
        for key, value in schema.items()
        if not (key == "nullable" and isinstance(value, bool))
    }
    return {"anyOf": [result, {"type": "null"}]} if schema.get("nullable") is True else result


@pytest.fixture(scope="module")
def plan_schema() -> Draft4Validator:
    """The `Plan` component as the generated OpenAPI document has it."""
    document = SchemaGenerator().get_schema(request=None, public=True)
    components = {**document["components"]}
    components["schemas"] = json_schema(components["schemas"])
    for schema in components["schemas"].values():
        Draft4Validator.check_schema(schema)
    return Draft4Validator({"$ref": "#/components/schemas/Plan", "components": components})


def accepted(data: Any) -> bool:
    try:
        parse_plan(data)
    except PlanInvalid:
        return False
    return True


# --------------------------------------------------------------------------- valid plans
# Plain functions of `draw` below: strategies built once, drawn from many times.
name_prefixes = st.sampled_from(["s", "step-", "A_b.", "9lives-", "x" * 90, "Fetch.v2_"])
run_names = st.text(min_size=1, max_size=30).filter(lambda n: bool(n.strip()) and n.isprintable())
# JSON values PostgreSQL can store (no NUL, no NaN).
storable_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=8),
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(st.sampled_from(["a", "b", "c d"]), children, max_size=3)
    ),
    max_leaves=10,
)
params = st.dictionaries(
    st.sampled_from(["text", "n", "url", "items"]),
    st.one_of(
        st.sampled_from(["hello", "${run.id}-${step.attempt}", "costs $5", "${run.name}"]),
        st.integers(-5, 5),
        st.lists(st.booleans(), max_size=2),
    ),
    max_size=3,
)
conditions = st.sampled_from(["true", "${run.attempt} > 1", "${run.priority} == 5"])


def durations(maximum_s: int) -> st.SearchStrategy[Any]:
    return st.one_of(
        st.integers(1, maximum_s),
        st.floats(0.001, float(maximum_s)),
        st.integers(1, maximum_s).map(lambda n: f"{n}s"),
        st.integers(1, maximum_s * 1000).map(lambda n: f" {n} ms"),
        st.integers(1, max(maximum_s // 60, 1)).map(lambda n: f"{n}m"),
        st.sampled_from(["1.5s", "0.25s", "250ms"]),
    )


step_timeouts = durations(LIMITS.max_step_timeout_ms // 1000)
level_timeouts = durations(365 * 86_400)
attempts = st.integers(1, LIMITS.max_retry_attempts)
credits = st.one_of(
    st.decimals(Decimal("0.000001"), Decimal("999999999999.999999"), places=6).map(str),
    st.integers(1, 10**9),
    st.integers(1, 10**6).map(lambda n: n / 100),
)
timeouts = st.fixed_dictionaries(
    {},
    optional={
        **dict.fromkeys(
            ["run", "agent", "task", "pending", "paused", "resuming", "retrying"], level_timeouts
        ),
        "step": step_timeouts,
    },
)
PLAN_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "priority": st.integers(0, 9),
    "failure_mode": st.sampled_from(FAILURE_MODES),
    "max_attempts": st.integers(1, 10),
    "max_agents": st.integers(1, LIMITS.max_agents),
    "credits": credits,
    "variables": st.dictionaries(
        st.sampled_from(["topic", "n", "a key"]), storable_values, max_size=3
    ),
    "timeouts": timeouts,
}


def retry_policy(draw: st.DrawFn) -> dict[str, Any]:
    policy: dict[str, Any] = {}
    if draw(st.booleans()):
        policy["max_attempts"] = draw(attempts)
    if draw(st.booleans()):
        policy["max_failures"] = draw(attempts)
    if draw(st.booleans()):
        policy["backoff"] = draw(st.sampled_from(["fixed", "linear", "exponential"]))
    base = draw(st.integers(0, 3_600_000))
    if draw(st.booleans()):
        policy["base_delay_ms"] = base
    if draw(st.booleans()):
        policy["max_delay_ms"] = draw(st.integers(max(base, 100), 3_600_000))
    if draw(st.booleans()):
        policy["multiplier"] = draw(st.floats(1.0, 10.0) | st.integers(1, 10))
    if draw(st.booleans()):
        policy["jitter"] = draw(st.floats(0.0, 1.0) | st.sampled_from([0, 1]))
    if draw(st.booleans()):
        policy["retry_on"] = draw(st.lists(st.sampled_from(sorted(RETRYABLE_CODES)), max_size=3))
    return policy


def names(draw: st.DrawFn, count: int) -> list[str]:
    prefix = draw(name_prefixes)
    return [f"{prefix}{index}" for index in range(count)]


def step(
    draw: st.DrawFn, name: str, earlier: list[str], mode: str, handler: bool
) -> dict[str, Any]:
    tools = TOOLS if handler else [*TOOLS, "approval"]
    result: dict[str, Any] = {"name": name, "tool": draw(st.sampled_from(tools))}
    if draw(st.booleans()):
        result["params"] = draw(params)
    if draw(st.integers(0, 3)) == 0:
        result["when"] = draw(conditions)
    if draw(st.integers(0, 2)) == 0:
        result["retry"] = retry_policy(draw)
    if draw(st.integers(0, 2)) == 0:
        result["timeout"] = draw(step_timeouts)
    if handler:
        return result
    if mode == "dag" and earlier and draw(st.booleans()):
        result["depends_on"] = draw(st.lists(st.sampled_from(earlier), max_size=3, unique=True))
    elif draw(st.integers(0, 5)) == 0:
        result["depends_on"] = []  # fine in any mode
    if draw(st.integers(0, 3)) == 0:
        handlers = names(draw, draw(st.integers(0, 2)))
        result["on_error"] = [step(draw, h, [], "sequential", handler=True) for h in handlers]
    return result


def level(
    draw: st.DrawFn, node: dict[str, Any], key: str, default_mode: str, count: int, child: Any
) -> dict[str, Any]:
    """``node`` with a mode (sometimes left to its default) and ``count`` children under
    ``key``, which depend on earlier siblings only in a dag."""
    mode = draw(st.sampled_from([*MODES, None]))
    if mode:
        node["mode"] = mode
    siblings = names(draw, count)
    node[key] = [
        child(draw, name, siblings[:index], mode or default_mode)
        for index, name in enumerate(siblings)
    ]
    return node


def node_fields(
    draw: st.DrawFn, node: dict[str, Any], earlier: list[str], parent_mode: str, limit: str
) -> dict[str, Any]:
    if draw(st.booleans()):
        node["failure_mode"] = draw(st.sampled_from(FAILURE_MODES))
    if draw(st.booleans()):
        node[limit] = draw(st.integers(1, 10_000))
    if parent_mode == "dag" and earlier and draw(st.booleans()):
        node["depends_on"] = draw(st.lists(st.sampled_from(earlier), max_size=2, unique=True))
    if draw(st.integers(0, 2)) == 0:
        node["timeout"] = draw(level_timeouts)
    return node


def task(draw: st.DrawFn, name: str, earlier: list[str], parent_mode: str) -> dict[str, Any]:
    def child(draw: st.DrawFn, name: str, earlier: list[str], mode: str) -> dict[str, Any]:
        return step(draw, name, earlier, mode, handler=False)

    node = level(draw, {"name": name}, "steps", "sequential", draw(st.integers(1, 4)), child)
    return node_fields(draw, node, earlier, parent_mode, "max_concurrent_steps")


def agent(draw: st.DrawFn, name: str, earlier: list[str], parent_mode: str) -> dict[str, Any]:
    node = level(draw, {"name": name}, "tasks", "sequential", draw(st.integers(1, 3)), task)
    return node_fields(draw, node, earlier, parent_mode, "max_concurrent_tasks")


@st.composite
def valid_plans(draw: st.DrawFn) -> dict[str, Any]:
    plan = level(
        draw, {"name": draw(run_names)}, "agents", "parallel", draw(st.integers(1, 3)), agent
    )
    for key, strategy in PLAN_FIELDS.items():
        if draw(st.booleans()):
            plan[key] = draw(strategy)
    return plan


# --------------------------------------------------------------------------- broken plans
def objects(plan: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Every object of ``plan`` with its kind."""
    found: list[tuple[str, dict[str, Any]]] = [("plan", plan)]
    if isinstance(plan.get("timeouts"), dict):
        found.append(("timeouts", plan["timeouts"]))
    for agent in plan["agents"]:
        found.append(("agent", agent))
        for task in agent["tasks"]:
            found.append(("task", task))
            for step in task["steps"]:
                found.append(("step", step))
                for handler in step.get("on_error", []):
                    found.append(("handler", handler))
                    if "retry" in handler:
                        found.append(("retry", handler["retry"]))
                if "retry" in step:
                    found.append(("retry", step["retry"]))
    return found


@st.composite
def broken_plans(draw: st.DrawFn) -> tuple[dict[str, Any], str]:
    """A well-formed plan broken in one field, and how."""
    plan = copy.deepcopy(draw(valid_plans()))
    kind, target = draw(st.sampled_from(objects(plan)))
    how = draw(st.sampled_from(["wrong type", "unknown field", "out of range", "missing"]))
    if how == "missing" and kind in REQUIRED:
        key = draw(st.sampled_from(REQUIRED[kind]))
        del target[key]
        return plan, f"{kind}.{key} missing"
    if how == "out of range":
        bounded = [field for (of, field) in RANGES if of == kind]
        if bounded:
            key = draw(st.sampled_from(bounded))
            low, high = RANGES[kind, key]
            step = 1 if isinstance(low, int) else 0.5
            target[key] = draw(st.sampled_from([low - step, high + step]))
            return plan, f"{kind}.{key} = {target[key]}"
    if how == "unknown field" or how == "out of range":
        keys = UNKNOWN_KEYS + (["depends_on", "on_error"] if kind == "handler" else [])
        key = draw(st.sampled_from(keys))
        target[key] = draw(json_values)
        return plan, f"{kind}.{key} unknown"
    key = draw(st.sampled_from(sorted(FIELDS[kind])))
    target[key] = draw(st.sampled_from(WRONG[FIELDS[kind][key]]))
    return plan, f"{kind}.{key} = {target[key]!r}"


# --------------------------------------------------------------------------- properties
EXAMPLES = settings(
    max_examples=300,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@EXAMPLES
@given(valid_plans())
def test_a_well_formed_plan_is_accepted_by_both(plan_schema: Draft4Validator, data: Any) -> None:
    assert isinstance(parse_plan(data), Plan)
    assert not list(plan_schema.iter_errors(data))


@EXAMPLES
@given(broken_plans())
def test_a_plan_broken_in_one_field_is_refused_by_both(
    plan_schema: Draft4Validator, broken: tuple[dict[str, Any], str]
) -> None:
    data, how = broken
    assert not accepted(data), how
    assert list(plan_schema.iter_errors(data)), how


@EXAMPLES
@given(st.one_of(plan_values, json_values))
def test_whatever_parse_plan_accepts_the_schema_accepts(
    plan_schema: Draft4Validator, data: Any
) -> None:
    if accepted(data):
        assert not list(plan_schema.iter_errors(data))


def test_a_nullable_field_takes_null_and_its_object_in_both(plan_schema: Draft4Validator) -> None:
    # `concurrency` is `ConcurrencyPolicy | None`: JSON Schema's null branch, which OpenAPI
    # 3.0 lacks, is `nullable: true` in the document (api/schema.py).
    plan = {"name": "n", "agents": [{"name": "a", "tasks": [{"name": "t", "steps": [
        {"name": "s", "tool": "noop"}]}]}]}  # fmt: skip
    valid: list[Any] = [None, {"key": "customer-1", "max_runs": 2}]
    for concurrency in valid:
        data = {**plan, "concurrency": concurrency}
        assert accepted(data), concurrency
        assert not list(plan_schema.iter_errors(data)), concurrency
    invalid: list[Any] = ["customer-1", {"max_runs": 2}, {"key": "k", "max_runs": 0}]
    for concurrency in invalid:
        data = {**plan, "concurrency": concurrency}
        assert not accepted(data), concurrency
        assert list(plan_schema.iter_errors(data)), concurrency
