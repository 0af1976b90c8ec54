"""Durations in a plan over HTTP: the plan's own `timeout`s and the tools' duration
parameters take the same forms and are refused in the same words, with their path
(docs/api.md, "Durations")."""

from __future__ import annotations

from typing import Any

import pytest

from runs.models import Run
from runs.plan.durations import DURATION_FORMS
from tests.tenants import Tenant

pytestmark = pytest.mark.django_db

RUNS = "/api/v1/runs"
STEP = "agents[0].tasks[0].steps[0]"


def plan_with(tool: str, params: dict[str, Any], **extra: Any) -> dict[str, Any]:
    step = {"name": "s", "tool": tool, "params": params}
    return {
        "name": "d",
        "agents": [{"name": "a", "tasks": [{"name": "t", "steps": [step]}]}],
        **extra,
    }


def not_a_duration(shown: str) -> str:
    return f"must be a duration of at least 1ms such as {DURATION_FORMS}, got {shown}"


POLL = {"url": "https://status.example/1", "done_when": "${response.status} == 200"}


@pytest.mark.parametrize(
    ("tool", "params"),
    [
        ("runner", {"prompt": "hi", "match_timeout": "3s"}),
        ("runner", {"prompt": "hi", "match_timeout": "5m"}),
        ("runner", {"prompt": "hi", "match_timeout": 90}),
        ("http", {"url": "https://example.com/", "timeout": "250ms"}),
        ("llm", {"prompt": "hi", "timeout": "2m"}),
        ("callback", {"timeout": "2h"}),
        ("poll", {**POLL, "interval": "1.5s", "timeout": "1h"}),
    ],
    ids=repr,
)
def test_a_tool_duration_in_the_plans_forms_is_accepted(
    tenant: Tenant, tool: str, params: dict[str, Any]
) -> None:
    response = tenant.post(RUNS, {"plan": plan_with(tool, params)})

    assert response.status_code == 201, response.json()
    # The plan is stored as written: the duration is read again when the step runs.
    assert response.json()["plan"]["agents"][0]["tasks"][0]["steps"][0]["params"] == params


def test_a_runner_step_with_match_timeout_3s_starts(tenant: Tenant) -> None:
    plan = plan_with("runner", {"prompt": "hi", "match_timeout": "3s"})

    response = tenant.post(RUNS, {"plan": plan, "start": True})

    assert response.status_code == 201, response.json()
    assert response.json()["status"] in ("pending", "running")


def test_a_tool_duration_that_is_no_duration_is_refused_with_its_path_and_the_plans_words(
    tenant: Tenant,
) -> None:
    plan = plan_with(
        "runner", {"prompt": "hi", "match_timeout": "3 parsecs"}, timeouts={"run": "3 parsecs"}
    )

    response = tenant.post(RUNS, {"plan": plan})

    body = response.json()
    assert response.status_code == 400
    assert body["code"] == "invalid_plan"
    assert body["details"] == [
        {"path": "timeouts.run", "message": not_a_duration("'3 parsecs'")},
        {"path": f"{STEP}.params.match_timeout", "message": not_a_duration("'3 parsecs'")},
    ]
    assert not Run.objects.exists()


@pytest.mark.parametrize(
    ("tool", "params", "field", "message"),
    [
        (
            "runner",
            {"prompt": "hi", "match_timeout": "30"},
            "match_timeout",
            not_a_duration("'30'"),
        ),
        ("runner", {"prompt": "hi", "match_timeout": 0}, "match_timeout", not_a_duration("0")),
        (
            "runner",
            {"prompt": "hi", "match_timeout": "2d"},
            "match_timeout",
            "must be at most 1d, got '2d'",
        ),
        (
            "runner",
            {"prompt": "hi", "match_timeout": "900ms"},
            "match_timeout",
            "must be at least 1s, got '900ms'",
        ),
        (
            "http",
            {"url": "https://example.com/", "timeout": "2h"},
            "timeout",
            "must be at most 1h, got '2h'",
        ),
        ("llm", {"prompt": "hi", "timeout": "soon"}, "timeout", not_a_duration("'soon'")),
        ("callback", {"timeout": "31d"}, "timeout", "must be at most 30d, got '31d'"),
        ("poll", {**POLL, "interval": "10ms"}, "interval", "must be at least 50ms, got '10ms'"),
        ("poll", {**POLL, "timeout": True}, "timeout", not_a_duration("true")),
    ],
    ids=repr,
)
def test_a_tool_duration_out_of_its_forms_or_bounds_is_refused_with_its_path(
    tenant: Tenant, tool: str, params: dict[str, Any], field: str, message: str
) -> None:
    response = tenant.post(RUNS, {"plan": plan_with(tool, params)})

    assert response.status_code == 400
    assert response.json()["code"] == "invalid_plan"
    assert response.json()["details"] == [{"path": f"{STEP}.params.{field}", "message": message}]


def test_a_duration_in_a_callback_request_is_checked_at_its_own_path(tenant: Tenant) -> None:
    params = {"request": {"url": "https://ci.example/builds", "timeout": "3 parsecs"}}

    response = tenant.post(RUNS, {"plan": plan_with("callback", params)})

    assert response.status_code == 400
    assert response.json()["details"] == [
        {"path": f"{STEP}.params.request.timeout", "message": not_a_duration("'3 parsecs'")}
    ]


def test_a_param_named_for_its_unit_takes_a_number_only(tenant: Tenant) -> None:
    response = tenant.post(RUNS, {"plan": plan_with("sleep", {"seconds": "3s"})})

    assert response.status_code == 400
    assert response.json()["details"] == [
        {"path": f"{STEP}.params.seconds", "message": "must be a number from 0 to 86400"}
    ]


@pytest.mark.parametrize(
    ("params", "field", "message"),
    [
        ({"for": "367d"}, "for", "must be at most 366d, got '367d'"),
        (
            {"until": "2026-12-01"},
            "until",
            "must be an RFC 3339 time with its offset, got '2026-12-01'",
        ),
        ({}, "for", "give one of for (a duration) or until (an RFC 3339 time)"),
    ],
    ids=repr,
)
def test_a_wait_beyond_a_year_and_a_day_or_without_its_offset_is_refused_with_its_path(
    tenant: Tenant, params: dict[str, Any], field: str, message: str
) -> None:
    response = tenant.post(RUNS, {"plan": plan_with("wait", params)})

    assert response.status_code == 400
    assert response.json()["code"] == "invalid_plan"
    assert response.json()["details"] == [{"path": f"{STEP}.params.{field}", "message": message}]
    assert not Run.objects.exists()
