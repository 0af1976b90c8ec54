"""`${secrets.NAME}` in plans: one well-formed name, in step and handler parameters only;
never in a `when` condition. Whether the secret exists is a question for the worker."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.runs.plans import STEP, assert_only_error, errors_of, one_step, valid
from tests.secret_spellings import every_spelling

HANDLER = f"{STEP}.on_error[0]"


def with_handler(**handler: Any) -> dict[str, Any]:
    return one_step(tool="fail", on_error=[{"name": "cleanup", "tool": "echo", **handler}])


@pytest.mark.parametrize(
    "text",
    [
        "${secrets.API_TOKEN}",
        "Bearer ${secrets.API_TOKEN}",
        "${secrets._x1}",
        '${secrets["API_TOKEN"]}',
        "${secrets." + "N" * 100 + "}",
        "${run.id}-${step.id}-${step.attempt}:${secrets.KEY}",
    ],
    ids=["whole", "spliced", "underscore", "quoted", "longest", "with-idempotency-key"],
)
def test_a_secret_reference_in_params_is_accepted_even_if_no_such_secret_exists(
    text: str,
) -> None:
    result = valid(one_step(tool="echo", params={"headers": {"Authorization": text}}))

    # The plan keeps the template: the value never enters a stored plan.
    assert result.agents[0].tasks[0].steps[0].params == {"headers": {"Authorization": text}}


def test_a_secret_reference_in_a_handlers_params_is_accepted() -> None:
    valid(with_handler(params={"token": "${secrets.API_TOKEN}"}))


@pytest.mark.parametrize(
    "text",
    [
        "${secrets}",
        "${secrets.A.B}",
        "${secrets.my-token}",
        '${secrets["1x"]}',
        '${secrets["a b"]}',
        "${secrets[0]}",
        "${secrets." + "N" * 101 + "}",
    ],
    ids=["no-name", "a-field", "hyphen", "digit-first", "space", "index", "too-long"],
)
def test_a_malformed_secret_reference_is_refused(text: str) -> None:
    assert_only_error(
        one_step(tool="echo", params={"token": text}), f"{STEP}.params.token", "name one secret"
    )


@pytest.mark.parametrize(
    "when",
    ["${secrets.FLAG} == 'on'", "${secrets.FLAG}", "not ${secrets.FLAG}"],
    ids=["comparison", "truthiness", "negation"],
)
def test_a_secret_in_a_condition_is_refused(when: str) -> None:
    assert_only_error(
        one_step(tool="echo", when=when), f"{STEP}.when", "secrets cannot be used in conditions"
    )


def test_a_secret_in_a_handlers_condition_is_refused() -> None:
    assert_only_error(
        with_handler(when="${secrets.FLAG} == 'x'"),
        f"{HANDLER}.when",
        "secrets cannot be used in conditions",
    )


def test_the_current_step_fields_are_accepted_and_others_refused() -> None:
    valid(one_step(tool="echo", params={"k": "${step.id}/${step.name}/${step.attempt}"}))
    assert_only_error(
        one_step(tool="echo", params={"k": "${step.status}"}),
        f"{STEP}.params.k",
        "step exposes id, name, attempt",
    )


# --------------------------------------------------------------------------- kept as rendered
CHILD = {"name": "child", "agents": [{"name": "c", "tasks": [{"name": "t", "steps": [
    {"name": "one", "tool": "echo", "params": {"auth": "${secrets.TOKEN}"}},
]}]}]}  # fmt: skip
REFUSED = "secrets cannot be used here"


def refused_paths(data: dict[str, Any]) -> list[str]:
    """The paths of the plan's problems, every one of them a secret refused, in order."""
    errors = errors_of(data)
    assert all(REFUSED in message for _, message in errors), errors
    return sorted(path for path, _ in errors)


@every_spelling
def test_a_runner_step_reading_a_secret_is_refused_wherever_it_is(spelling: str) -> None:
    params = {"prompt": f"Research {spelling}", "session_id": spelling,
              "demands": {"tags": ["gpu", spelling]}}  # fmt: skip
    assert refused_paths(one_step(tool="runner", params=params)) == [
        f"{STEP}.params.demands.tags[1]",
        f"{STEP}.params.prompt",
        f"{STEP}.params.session_id",
    ]


@every_spelling
def test_a_poll_reading_a_secret_is_refused_wherever_it_is(spelling: str) -> None:
    params = {"url": f"https://status.example/?key={spelling}",
              "headers": {"Authorization": spelling}, "query": {"k": [spelling]},
              "done_when": "${response.status} == 200"}  # fmt: skip
    assert refused_paths(one_step(tool="poll", params=params)) == [
        f"{STEP}.params.headers.Authorization",
        f"{STEP}.params.query.k[0]",
        f"{STEP}.params.url",
    ]


@every_spelling
def test_a_child_runs_variables_reading_a_secret_are_refused_with_the_way_to_pass_one(
    spelling: str,
) -> None:
    params = {"plan": CHILD, "variables": {"token": spelling, "deep": {"list": [spelling]}}}
    assert refused_paths(one_step(tool="run", params=params)) == [
        f"{STEP}.params.variables.deep.list[0]",
        f"{STEP}.params.variables.token",
    ]
    (_, message), _ = errors_of(one_step(tool="run", params=params))
    assert "write ${secrets.NAME} in the child's plan written out" in message


@every_spelling
def test_a_child_plan_written_out_may_read_a_secret_the_child_resolves(spelling: str) -> None:
    child = json.loads(json.dumps(CHILD))
    child["agents"][0]["tasks"][0]["steps"][0]["params"] = {"auth": spelling}
    valid(one_step(tool="run", params={"plan": child}))


@every_spelling
def test_a_child_plan_that_is_a_secret_reference_is_refused(spelling: str) -> None:
    errors = errors_of(one_step(tool="run", params={"plan": spelling}))
    assert f"{STEP}.params.plan" in [path for path, _ in errors], errors


@every_spelling
def test_a_secret_in_a_cache_key_is_refused_at_submission(spelling: str) -> None:
    plan = one_step(tool="echo", cache={"key": f"price:{spelling}", "ttl": "1h"})
    assert refused_paths(plan) == [f"{STEP}.cache.key"]


@every_spelling
def test_a_secret_in_a_rate_limits_key_or_units_is_refused_at_submission(spelling: str) -> None:
    plan = one_step(tool="echo", rate_limits=[{"name": "api", "key": spelling, "units": spelling}])
    assert refused_paths(plan) == [f"{STEP}.rate_limits[0].key", f"{STEP}.rate_limits[0].units"]


@every_spelling
def test_a_secret_in_a_waits_time_is_refused_at_submission(spelling: str) -> None:
    assert refused_paths(one_step(tool="wait", params={"for": spelling})) == [f"{STEP}.params.for"]


def test_a_secret_in_a_handlers_kept_parameter_is_refused_too() -> None:
    handler = {"name": "wait-a-bit", "tool": "wait", "params": {"until": "${ secrets.T }"}}
    assert refused_paths(one_step(tool="fail", on_error=[handler])) == [f"{HANDLER}.params.until"]
