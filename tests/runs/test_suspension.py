"""Suspending an organization (runs/people/suspension.py, docs/tenants.md): its keys answer 403
`organization_suspended`, its schedules skip with reason `suspended`, its running runs
are paused; unsuspending resumes the runs the suspension paused, and nothing else."""

from __future__ import annotations

import json
from datetime import timedelta
from io import StringIO
from typing import Any
from unittest import mock

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.test import Client

from billing.models import ApiKeyScope, Organization
from billing.services import api_key_create
from runs import services
from runs.admission import run_admission
from runs.engine import control
from runs.engine.start import run_start
from runs.models import Run
from runs.people import suspension
from runs.selectors import run_history
from schedules import services as schedule_services
from schedules.models import ScheduleFire
from tests import factories
from tests.schedules.conftest import T0, make_schedule
from tests.tenants import make_tenant

pytestmark = pytest.mark.django_db

MINUTE = timedelta(minutes=1)
RUNS = "/api/v1/runs"


def running(organization: Organization) -> Run:
    run = factories.run(organization)
    run_start(run_id=run.pk)
    services.run_pick_up(run_id=run.pk)  # a no-op when the start began it at once
    run.refresh_from_db()
    assert run.status == "running"
    return run


def status(run: Run) -> str:
    return Run.objects.values_list("status", flat=True).get(pk=run.pk)


def suspended(organization: Organization) -> tuple[Any, str]:
    return Organization.objects.values_list("suspended_at", "suspended_reason").get(
        pk=organization.pk
    )


def command(name: str, *args: str) -> dict[str, Any]:
    out = StringIO()
    call_command(name, *args, stdout=out)
    result: dict[str, Any] = json.loads(out.getvalue())
    return result


def fires(schedule_id: Any) -> list[tuple[str, str, str]]:
    rows = ScheduleFire.objects.filter(schedule_id=schedule_id).order_by("id")
    return [(fire.status, fire.reason, fire.message) for fire in rows]


def test_suspension_end_to_end() -> None:
    tenant, bystander = make_tenant(), make_tenant()
    organization = tenant.organization
    first, second = running(organization), running(organization)
    paused_by_a_person = running(organization)
    services.run_pause(run_id=paused_by_a_person.pk, actor="api:someone")
    elsewhere = running(bystander.organization)
    schedule = make_schedule(organization, interval="1m")
    assert tenant.get(RUNS).status_code == 200

    done = command("suspend_org", organization.name, "--reason", "unpaid invoices")

    assert set(done["runs_paused"]) == {str(first.pk), str(second.pk)}
    assert done["reason"] == "unpaid invoices"
    assert suspended(organization)[0] is not None
    # Every request with its keys, whatever the route, method or scope.
    _, read_key = api_key_create(organization=organization, scope=ApiKeyScope.READ)
    reader = Client(headers={"Authorization": f"Bearer {read_key}"})
    for answer in (
        tenant.get(RUNS),
        tenant.post(RUNS, {"plan": factories.plan()}),
        tenant.get("/api/v1/organization"),
        tenant.get(f"{RUNS}/{first.pk}"),
        reader.get(RUNS),
    ):
        assert answer.status_code == 403
        assert answer.json()["code"] == "organization_suspended"
        assert "unpaid" not in answer.json()["message"]  # the reason is the operators'
    assert bystander.get(RUNS).status_code == 200
    # Its schedule skips the due time, recorded.
    runs_before = Run.objects.filter(organization=organization).count()
    schedule_services.schedules_fire_due(now=T0 + MINUTE)
    assert fires(schedule.pk) == [("skipped", "suspended", "the organization is suspended")]
    assert Run.objects.filter(organization=organization).count() == runs_before
    # Its running runs are paused by the suspension; the rest as they were.
    assert [status(run) for run in (first, second, paused_by_a_person)] == ["paused"] * 3
    assert status(elsewhere) == "running"
    pause = run_history(first).filter(entity="run", to_status="paused").get()
    assert pause.actor == suspension.SUSPENSION_ACTOR

    unsuspended = command("unsuspend_org", str(organization.pk))

    assert set(unsuspended["runs_resumed"]) == {str(first.pk), str(second.pk)}
    assert [status(run) for run in (first, second)] == ["resuming"] * 2
    assert status(paused_by_a_person) == "paused"
    assert status(elsewhere) == "running"
    assert suspended(organization) == (None, "")
    assert tenant.get(RUNS).status_code == 200
    schedule_services.schedules_fire_due(now=T0 + 2 * MINUTE)
    assert [fire[:2] for fire in fires(schedule.pk)] == [("skipped", "suspended"), ("fired", "")]


def test_a_run_about_to_begin_when_the_suspension_came_waits_until_it_is_lifted(
    settings: Any,
) -> None:
    organization = make_tenant().organization
    settings.ENGINE_START_AT_ONCE_STEPS = 0  # started as a pick-up, admitted at its start
    run = factories.run(organization)
    run_start(run_id=run.pk)
    assert Run.objects.filter(pk=run.pk, admitted_at__isnull=False).exists()
    suspension.organization_suspend(organization=organization, reason="abuse")

    # Its pick-up (in flight when the suspension came) does not begin it: it waits,
    # its place given back, and says why.
    assert control.pick_up(run.pk) is False
    held = Run.objects.get(pk=run.pk)
    assert (held.status, held.queued_reason, held.admitted_at) == (
        "pending",
        run_admission.SUSPENDED,
        None,
    )

    with mock.patch.object(run_admission, "enqueue_run_message") as enqueued:
        suspension.organization_unsuspend(organization=organization)
    # Unsuspending asks for its pick-up, which begins it now.
    assert [call.args[1] for call in enqueued.call_args_list] == [run.pk]
    assert control.pick_up(run.pk) is True
    assert status(run) == "running"


def test_unsuspending_leaves_a_run_whose_last_pause_was_a_persons() -> None:
    organization = factories.org()
    run = running(organization)
    suspension.organization_suspend(organization=organization)
    # An operator resumes it during the suspension, then pauses it again.
    services.run_resume(run_id=run.pk, actor="admin:ops")
    services.run_resumed(run_id=run.pk)
    services.run_pause(run_id=run.pk, actor="admin:ops")

    done = suspension.organization_unsuspend(organization=organization)

    assert done.runs == []
    assert status(run) == "paused"


def test_suspending_again_keeps_the_first_moment_and_takes_the_new_reason() -> None:
    organization = factories.org()
    first = suspension.organization_suspend(organization=organization, reason="abuse report")
    run = running(organization)  # started meanwhile (a run waiting to start was picked up)

    again = suspension.organization_suspend(organization=organization, reason="")
    third = suspension.organization_suspend(organization=organization, reason="confirmed")

    assert again.organization.suspended_at == first.organization.suspended_at
    assert again.organization.suspended_reason == "abuse report"
    assert third.organization.suspended_reason == "confirmed"
    assert again.runs == [run.pk]  # running the command again pauses what it missed
    assert third.runs == []


def test_unsuspending_an_organization_not_suspended_changes_nothing() -> None:
    organization = factories.org()
    run = running(organization)
    services.run_pause(run_id=run.pk, actor="api:someone")

    done = suspension.organization_unsuspend(organization=organization)

    assert done.runs == []
    assert status(run) == "paused"


def test_the_commands_refuse_an_unknown_organization() -> None:
    with pytest.raises(CommandError, match="no organization"):
        command("suspend_org", "nobody")
    with pytest.raises(CommandError, match="no organization"):
        command("unsuspend_org", "nobody")


def test_the_admin_suspends_with_a_reason_and_unsuspends(client: Client) -> None:
    client.force_login(User.objects.create_superuser("ops", "ops@example.com", "pw-123456789"))
    organization = factories.org()
    run = running(organization)
    selected = {"action": "suspend", "_selected_action": [str(organization.pk)]}

    form_page = client.post("/admin/billing/organization/", selected)
    assert form_page.status_code == 200
    assert 'name="reason"' in form_page.content.decode()
    client.post("/admin/billing/organization/", {**selected, "apply": "1", "reason": "chargeback"})

    assert suspended(organization)[1] == "chargeback"
    assert suspended(organization)[0] is not None
    assert status(run) == "paused"
    page = client.get(f"/admin/billing/organization/{organization.pk}/change/").content.decode()
    assert "chargeback" in page

    client.post("/admin/billing/organization/", {**selected, "action": "unsuspend"})

    assert suspended(organization) == (None, "")
    assert status(run) == "resuming"


def last_pause_by(run: Run) -> str:
    pauses = run_history(run).filter(entity="run", to_status="paused")
    return str(pauses.latest("id").actor)


def test_a_run_caught_resuming_is_paused_by_its_resume_and_resumed_when_it_is_lifted() -> None:
    organization = factories.org()
    run = running(organization)
    services.run_pause(run_id=run.pk, actor="api:someone")
    services.run_resume(run_id=run.pk, actor="api:someone")  # its worker's resume in flight

    done = suspension.organization_suspend(organization=organization)

    assert (done.runs, status(run)) == ([], "resuming")  # left to its resume
    assert control.resume(run.pk) is True
    assert status(run) == "paused"
    assert last_pause_by(run) == suspension.SUSPENSION_ACTOR
    assert suspension.organization_unsuspend(organization=organization).runs == [run.pk]
    assert control.resume(run.pk) is True
    assert status(run) == "running"


def test_a_run_that_resumed_before_the_suspension_is_paused_by_it() -> None:
    organization = factories.org()
    run = running(organization)
    services.run_pause(run_id=run.pk, actor="api:someone")
    services.run_resume(run_id=run.pk, actor="api:someone")
    assert control.resume(run.pk) is True

    done = suspension.organization_suspend(organization=organization)

    assert (done.runs, status(run)) == ([run.pk], "paused")
    assert last_pause_by(run) == suspension.SUSPENSION_ACTOR
