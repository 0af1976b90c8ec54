"""Approve and reject from the admin's run list (SPEC section 4): through
``runs.approvals`` as the API, recorded with the operator's name; a run with nothing
waiting is named, not counted."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client

from runs.models import Run, RunEvent, Step
from tests import factories
from tests.api import states

pytestmark = pytest.mark.django_db


@pytest.fixture
def operator(client: Client) -> Client:
    client.force_login(User.objects.create_superuser("ops", "ops@example.com", "long-password"))
    return client


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
    assert RunEvent.objects.filter(run=waiting, entity="step", actor="admin:ops").exists()
    assert Run.objects.get(pk=waiting.pk).status != "waiting_approval"


def test_reject_fails_the_waiting_step_with_approval_rejected(operator: Client) -> None:
    waiting = states.waiting_approval(factories.org())

    page = act(operator, "reject_runs", waiting)

    assert "Rejected: 1 run(s)" in page
    step = Step.objects.get(run=waiting, tool="approval")
    assert step.status == "failed"
    assert step.error["code"] == "approval_rejected"
    assert RunEvent.objects.filter(run=waiting, actor="admin:ops").exists()
