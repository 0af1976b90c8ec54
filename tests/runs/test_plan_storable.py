"""Values PostgreSQL cannot store (NUL characters, unpaired surrogates, in keys or
values) are refused with their path, all at once, and the run service stores nothing."""

from __future__ import annotations

from typing import Any

import pytest

from runs.models import Run
from runs.plan import PlanInvalid
from runs.services import run_create
from tests import factories
from tests.runs.plans import STEP, assert_only_error, errors_of, one_step, plan, the_step, valid


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
