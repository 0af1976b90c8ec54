"""What a plan says about reuse: a step's `cache`, and which steps a fork from a step runs
again (runs.forks.downstream) at every level."""

from __future__ import annotations

from typing import Any

import pytest

from runs.forks import downstream
from runs.plan import PlanInvalid, parse_plan
from tests.runs.plans import one_step, the_step, valid, with_handler


def paths_of(error: PlanInvalid) -> list[str]:
    return [problem.path for problem in error.errors]


def test_a_cache_keeps_its_key_template_and_its_ttl_in_milliseconds() -> None:
    data = one_step(tool="echo", cache={"key": "k:${variables.q}", "ttl": "1.5h"})
    plan = valid({**data, "variables": {"q": "chips"}})

    assert the_step(plan).cache.stored() == {
        "key": "k:${variables.q}",
        "ttl_ms": 5_400_000,
        "inputs": True,
    }


def test_a_cache_may_say_its_entries_answer_any_params_of_its_key() -> None:
    data = one_step(tool="echo", cache={"key": "k", "ttl": "1h", "inputs": False})

    assert the_step(valid(data)).cache.stored() == {
        "key": "k",
        "ttl_ms": 3_600_000,
        "inputs": False,
    }


@pytest.mark.parametrize(
    ("cache", "path"),
    [
        ({"key": "k", "ttl": "1h", "inputs": "false"}, "agents[0].tasks[0].steps[0].cache.inputs"),
        ({"key": "k", "ttl": "1h", "inputs": 0}, "agents[0].tasks[0].steps[0].cache.inputs"),
        ({"key": "", "ttl": "1h"}, "agents[0].tasks[0].steps[0].cache.key"),
        ({"key": "k", "ttl": "forever"}, "agents[0].tasks[0].steps[0].cache.ttl"),
        ({"key": "k"}, "agents[0].tasks[0].steps[0].cache.ttl"),
        ({"key": "${steps.nowhere.output}", "ttl": "1h"}, "agents[0].tasks[0].steps[0].cache.key"),
    ],
)
def test_a_cache_without_a_key_or_a_ttl_or_with_a_bad_template_is_refused(
    cache: dict[str, Any], path: str
) -> None:
    with pytest.raises(PlanInvalid) as refused:
        parse_plan(one_step(tool="echo", cache=cache))

    assert path in paths_of(refused.value)


def test_a_handler_has_no_cache() -> None:
    with pytest.raises(PlanInvalid) as refused:
        parse_plan(with_handler(cache={"key": "k", "ttl": "1h"}))

    assert paths_of(refused.value) == ["agents[0].tasks[0].steps[0].on_error[0].cache"]


def step(name: str, *depends_on: str) -> dict[str, Any]:
    return {"name": name, "tool": "noop", "depends_on": list(depends_on)}


def test_a_fork_runs_what_waits_for_its_step_at_every_level() -> None:
    plan = parse_plan(
        {
            "name": "levels",
            "mode": "dag",
            "agents": [
                {
                    "name": "a",
                    "tasks": [
                        {
                            "name": "t1",
                            "mode": "dag",
                            "steps": [step("x"), step("y", "x"), step("z"), step("w", "y")],
                        },
                        {"name": "t2", "steps": [step("s")]},
                    ],
                },
                {"name": "b", "depends_on": ["a"], "tasks": [{"name": "t", "steps": [step("s")]}]},
                {"name": "c", "tasks": [{"name": "t", "steps": [step("s")]}]},
            ],
        }
    )

    # In the dag task: y and what waits for it (w), not its sibling z nor x before it;
    # the sequential agent's next task; the agent that depends on a, not c.
    assert downstream(plan, "a.t1.y") == {"a.t1.y", "a.t1.w", "a.t2.s", "b.t.s"}
    assert downstream(plan, "c.t.s") == {"c.t.s"}
    assert downstream(plan, "a.t1.nowhere") is None
    assert downstream(plan, "a.t1") is None
