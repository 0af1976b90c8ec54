"""Forks over HTTP: what the fork view refuses before anything is written
(api/reuse.py, runs/forks.py)."""

from __future__ import annotations

from typing import Any

import pytest

from runs.models import Run
from tests.api import states
from tests.tenants import Tenant


@pytest.mark.parametrize(
    ("plan", "named"),
    [("x", "a string"), (["x"], "a list"), (7, "a number"), (True, "a boolean")],
)
@pytest.mark.parametrize("dry_run", [False, True])
def test_a_fork_whose_plan_is_not_an_object_is_refused_as_an_invalid_fork(
    tenant: Tenant, plan: Any, named: str, dry_run: bool
) -> None:
    source = states.failed(tenant.organization)
    runs_before = Run.objects.count()

    answer = tenant.post(
        f"/api/v1/runs/{source.pk}/fork",
        {"from": "agent-0.task-0.step-0", "plan": plan, "start": False, "dry_run": dry_run},
    )

    assert answer.status_code == 400, answer.json()
    assert answer.json()["code"] == "invalid_fork"
    assert answer.json()["message"] == (
        f"plan must be an object (a run's plan; left out, the source's), got {named}"
    )
    assert answer.json()["details"] == {"paths": []}
    assert Run.objects.count() == runs_before


def test_a_fork_whose_plan_holds_variables_that_are_not_an_object_is_an_invalid_plan(
    tenant: Tenant,
) -> None:
    source = states.failed(tenant.organization)
    plan = {**source.plan, "variables": ["x"]}

    answer = tenant.post(
        f"/api/v1/runs/{source.pk}/fork",
        {"from": "agent-0.task-0.step-0", "plan": plan, "variables": {"v": 1}, "start": False},
    )

    assert answer.status_code == 400, answer.json()
    assert answer.json()["code"] == "invalid_plan"
    assert [problem["path"] for problem in answer.json()["details"]] == ["variables"]
