"""What a plan may say about child runs, callbacks and polls, checked at submit time."""

from __future__ import annotations

from typing import Any

import pytest
from django.conf import settings

from runs.plan import PlanInvalid, parse_plan


def plan_of(*steps: dict[str, Any], **extra: Any) -> dict[str, Any]:
    tasks = [{"name": "t", "steps": list(steps)}]
    return {"name": "p", "agents": [{"name": "a", "tasks": tasks}], **extra}


def nested(levels: int) -> dict[str, Any]:
    """A plan whose `run` steps write child plans ``levels`` deep."""
    plan = plan_of({"name": "leaf", "tool": "noop"})
    for _ in range(levels):
        plan = plan_of({"name": "spawn", "tool": "run", "params": {"plan": plan}})
    return plan


def problems(plan: dict[str, Any]) -> list[str]:
    with pytest.raises(PlanInvalid) as refused:
        parse_plan(plan)
    return [str(error) for error in refused.value.errors]


STEP = "agents[0].tasks[0].steps[0]"


def test_run_max_depth_levels_of_child_plans_may_be_written_out() -> None:
    assert parse_plan(nested(settings.RUN_MAX_DEPTH))
    found = problems(nested(settings.RUN_MAX_DEPTH + 1))
    assert found == [
        f"{STEP}.params.plan: child runs are written {settings.RUN_MAX_DEPTH + 1} levels deep "
        f"here; at most RUN_MAX_DEPTH ({settings.RUN_MAX_DEPTH}) allowed"
    ]


def test_a_written_out_child_plan_is_checked_with_its_parent() -> None:
    child = plan_of({"name": "x", "tool": "nope"}, variables={"v": 1})
    found = problems(plan_of({"name": "spawn", "tool": "run", "params": {"plan": child}}))
    assert len(found) == 1
    assert found[0].startswith(f"{STEP}.params.plan.agents[0].tasks[0].steps[0].tool: unknown")


def test_a_child_plan_keeps_its_own_templates() -> None:
    # ${variables.word} is the child's variable, not the parent's (which has none).
    child = plan_of(
        {"name": "x", "tool": "echo", "params": {"message": "${variables.word}"}},
        variables={"word": "hi"},
    )
    assert parse_plan(plan_of({"name": "spawn", "tool": "run", "params": {"plan": child}}))


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({}, "params.plan: is required"),
        ({"plan": "plain text"}, "params.plan: must be a run plan (an object) or a template"),
        ({"plan": {"name": "x"}, "execution_mode": "later"}, "params.execution_mode: must be"),
        ({"plan": "${variables.sub}", "extra": 1}, "params.extra: is not a parameter"),
        ({"plan": "${variables.nope}"}, "unknown variable 'nope'"),
    ],
)
def test_run_parameters_are_checked(params: dict[str, Any], message: str) -> None:
    step = {"name": "spawn", "tool": "run", "params": params}
    found = problems(plan_of(step, variables={"sub": {}}))
    assert any(message in problem for problem in found), found


HANDLER = {"name": "h", "tool": "echo", "params": {"message": "${callback.status}"}}


def test_async_callback_needs_on_callback_and_only_it_has_them() -> None:
    child = nested(0)
    lacking = {
        "name": "s",
        "tool": "run",
        "params": {"plan": child, "execution_mode": "async_callback"},
    }
    misplaced = {"name": "s", "tool": "noop", "on_callback": [HANDLER]}
    sync = {"name": "s", "tool": "run", "params": {"plan": child}, "on_callback": [HANDLER]}

    assert "needs on_callback steps" in problems(plan_of(lacking))[0]
    for step in (misplaced, sync):
        assert problems(plan_of(step)) == [
            f"{STEP}.on_callback: only a run step with execution_mode async_callback has "
            "on_callback steps"
        ]
    good = {**lacking, "on_callback": [HANDLER, {"name": "h2", "tool": "noop"}]}
    parsed = parse_plan(plan_of(good))
    assert [h.name for h in parsed.agents[0].tasks[0].steps[0].on_callback] == ["h", "h2"]


@pytest.mark.parametrize(
    ("step", "message"),
    [
        (
            {"name": "s", "tool": "echo", "params": {"message": "${callback.url}"}},
            "'callback' is only available in a callback step's parameters",
        ),
        (
            {"name": "s", "tool": "callback", "params": {"request": {"url": "${callback.status}"}}},
            "callback exposes url",
        ),
        (
            {"name": "s", "tool": "callback", "params": {"timeout": -1}},
            "params.timeout: must be a duration of at least 1ms",
        ),
        (
            {"name": "s", "tool": "callback", "params": {"request": {"url": "ftp://x"}}},
            "params.request.url",
        ),
    ],
)
def test_callback_references_and_parameters_are_checked(step: dict[str, Any], message: str) -> None:
    assert any(message in problem for problem in problems(plan_of(step)))


def test_a_callback_step_may_send_its_url() -> None:
    request = {
        "url": "https://ci.example/build",
        "method": "POST",
        "json": {"notify": "${callback.url}"},
    }
    assert parse_plan(plan_of({"name": "s", "tool": "callback", "params": {"request": request}}))


POLL = {"url": "https://status.example/1", "done_when": "${response.body.state} == 'done'"}


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"url": "https://x"}, "params.done_when: is required"),
        ({**POLL, "done_when": "${steps.a.output} == 1"}, "a poll condition reads only response"),
        ({**POLL, "failed_when": "${response.nope} == 1"}, "a poll condition reads only response"),
        ({**POLL, "done_when": "${response.status} =="}, "bad condition"),
        ({**POLL, "interval": 0}, "params.interval: must be a duration of at least 1ms"),
        ({**POLL, "interval": "10ms"}, "params.interval: must be at least 50ms, got '10ms'"),
        ({**POLL, "timeout": "31d"}, "params.timeout: must be at most 30d, got '31d'"),
        ({**POLL, "headers": {"Authorization": "${secrets.TOKEN}"}}, "secrets cannot be used here"),
        ({**POLL, "url": "file:///etc"}, "params.url: must be an http(s) URL"),
    ],
)
def test_poll_parameters_are_checked(params: dict[str, Any], message: str) -> None:
    found = problems(plan_of({"name": "s", "tool": "poll", "params": params}))
    assert any(message in problem for problem in found), found


def test_a_poll_condition_is_not_a_template_of_the_plan() -> None:
    params = {**POLL, "failed_when": "${response.status} >= 500", "url": "${variables.u}"}
    assert parse_plan(
        plan_of({"name": "s", "tool": "poll", "params": params}, variables={"u": "x"})
    )
