"""The organization's limits in the admin: set through the service (a raised limit asks
for the waiting runs at once), and the runs running and queued shown per organization."""

from __future__ import annotations

import pytest
from django.test import Client

from billing.models import Organization
from runs import services
from runs.admission import run_admission
from runs.engine import control
from runs.engine.start import run_start
from runs.models import Run
from runs.outbox import RunMessage
from tests import factories

pytestmark = pytest.mark.django_db


def form(organization: Organization, **limits: str) -> dict[str, str]:
    return {
        "name": organization.name,
        "api_keys-TOTAL_FORMS": "0",
        "api_keys-INITIAL_FORMS": "0",
        **limits,
    }


def test_the_limits_are_set_in_the_form_and_ask_for_the_waiting_runs(
    operator: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    organization = factories.org(name="acme")
    run_admission.limits_set(organization.pk, actor="test", max_running_runs=1)
    for _ in range(2):
        run = services.run_create(organization=organization, plan=factories.plan())
        run_start(run_id=run.pk)
        control.pick_up(run.pk)
    waiting = Run.objects.get(organization=organization, status="pending")
    asked: list[tuple[str, object]] = []
    monkeypatch.setattr(
        run_admission,
        "enqueue_run_message",
        lambda message, run_id, priority: asked.append((message, run_id)),
    )
    url = f"/admin/billing/organization/{organization.pk}/change/"

    refused = operator.post(url, form(organization, max_running_runs="0", share="1"))
    assert refused.status_code == 200
    assert b"Ensure this value is greater than or equal to 1" in refused.content

    saved = operator.post(
        url, form(organization, max_running_runs="3", max_pending_runs="50", share="2")
    )

    assert saved.status_code == 302
    organization.refresh_from_db()
    assert (organization.max_running_runs, organization.max_running_steps) == (3, None)
    assert (organization.max_pending_runs, organization.share) == (50, 2)
    assert asked == [(RunMessage.ADMIT, waiting.pk)]
    page = operator.get(url).content
    assert b"Limits and fair share" in page
    assert b'name="max_running_runs" value="3"' in page


def test_the_list_shows_runs_running_and_queued_per_organization(operator: Client) -> None:
    organization = factories.org(name="busy-org")
    run_admission.limits_set(organization.pk, actor="test", max_running_runs=1)
    for _ in range(3):
        run = services.run_create(organization=organization, plan=factories.plan())
        run_start(run_id=run.pk)
        control.pick_up(run.pk)

    page = operator.get("/admin/billing/organization/").content.decode()

    assert "column-runs_running" in page
    assert "column-runs_queued" in page
    row = page[page.index("busy-org") :]
    row = row[: row.index("</tr>")]
    assert '<td class="field-runs_running">1</td>' in row
    assert '<td class="field-runs_queued">2</td>' in row


def test_starting_one_run_too_many_from_the_admin_is_refused_by_name(operator: Client) -> None:
    organization = factories.org()
    run_admission.limits_set(organization.pk, actor="test", max_pending_runs=1)
    first, second = (
        services.run_create(organization=organization, plan=factories.plan(name=name))
        for name in ("first", "second")
    )

    page = operator.post(
        "/admin/runs/run/",
        {"action": "start_runs", "_selected_action": [str(first.pk), str(second.pk)]},
        follow=True,
    ).content.decode()

    assert "Started: 1 run(s)" in page
    assert "the organization has 1 runs waiting to start, its limit" in page
    statuses = sorted(
        Run.objects.filter(organization=organization).values_list("status", flat=True)
    )
    assert statuses == ["created", "pending"]
