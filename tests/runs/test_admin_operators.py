"""What operators read and do in the admin's run pages: approve and reject from the run
list, through ``runs.people.approvals`` as the API, recorded with the operator's name (a run
with nothing waiting is named, not counted); events named by their path in the plan, not
by database ids."""

from __future__ import annotations

import pytest
from django.test import Client

from runs.models import Run, Step
from runs.selectors import run_history
from runs.transitions import claim_next_step
from tests import factories
from tests.api import states

pytestmark = pytest.mark.django_db


def act(operator: Client, action: str, *runs: Run) -> str:
    response = operator.post(
        "/admin/runs/run/",
        {"action": action, "_selected_action": [str(run.pk) for run in runs]},
        follow=True,
    )
    return str(response.content.decode())


def test_approve_completes_the_waiting_step_and_names_the_operator(operator: Client) -> None:
    organization = factories.org()
    waiting, idle = states.waiting_approval(organization), states.running(organization)

    page = act(operator, "approve_runs", waiting, idle)

    assert "Approved: 1 run(s)" in page
    assert f"no step of {idle.pk} waits for approval" in page
    step = Step.objects.get(run=waiting, tool="approval")
    assert step.status == "completed"
    assert step.output["comment"] == "by admin:ops in the admin"
    assert run_history(waiting).filter(entity="step", actor="admin:ops").exists()
    assert Run.objects.get(pk=waiting.pk).status != "waiting_approval"


def test_reject_fails_the_waiting_step_with_approval_rejected(operator: Client) -> None:
    waiting = states.waiting_approval(factories.org())

    page = act(operator, "reject_runs", waiting)

    assert "Rejected: 1 run(s)" in page
    step = Step.objects.get(run=waiting, tool="approval")
    assert step.status == "failed"
    assert step.error["code"] == "approval_rejected"
    assert run_history(waiting).filter(actor="admin:ops").exists()


def test_events_are_named_by_their_path_in_the_plan_and_attempt(operator: Client) -> None:
    spec = {
        "name": "paths",
        "agents": [
            {
                "name": "researcher",
                "tasks": [{"name": "fetch", "steps": [{"name": "topic", "tool": "noop"}]}],
            }
        ],
    }
    run = states.running_plan(factories.org(), spec)
    assert claim_next_step(run.pk, worker="w", task_id="t", lease_seconds=60) is not None

    listed = operator.get(f"/admin/runs/runevent/?run__id__exact={run.pk}").content.decode()
    page = operator.get(f"/admin/runs/run/{run.pk}/change/").content.decode()

    for html in (listed, page):
        assert "researcher.fetch.topic (attempt 1)" in html
        assert "researcher.fetch" in html
    step = Step.objects.get(run=run)
    assert f"step {step.pk}" not in page
