"""`${secrets.NAME}` in plans: one well-formed name, in step and handler parameters only;
never in a `when` condition. Whether the secret exists is a question for the worker."""

from __future__ import annotations

from typing import Any

import pytest

from tests.runs.test_spec import STEP, assert_only_error, one_step, valid

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
