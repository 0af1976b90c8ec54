"""The escalation routes: list with filters, show, acknowledge, resolve; their refusals
(an unknown action, a resolved ticket, the re-plan cap) and
the run each resolution leaves. Without a worker: the services move the run, the rows
say what a worker would do next (tests/integration/test_escalation.py runs them)."""

from __future__ import annotations

import pytest

from runs.models import EscalationTicket, Run
from tests.api import states
from tests.tenants import Tenant

pytestmark = pytest.mark.django_db

ESCALATIONS = "/api/v1/escalations"


def test_a_ticket_shows_every_field_clients_are_written_against(tenant: Tenant) -> None:
    ticket = states.escalation(tenant.organization)

    body = tenant.get(f"{ESCALATIONS}/{ticket.pk}").json()

    assert set(body) == {
        "id",
        "run",
        "attempt_number",
        "status",
        "reason",
        "severity",
        "errors",
        "opened_at",
        "acknowledged_at",
        "acknowledged_by",
        "resolved_at",
        "resolved_by",
        "resolution",
        "note",
        "notified_at",
    }
    assert (body["status"], body["reason"], body["run"]) == ("open", "operator", str(ticket.run_id))
    assert body["note"] == "have a look"


def test_the_list_filters_by_status_and_run(tenant: Tenant) -> None:
    first, second = states.escalation(tenant.organization), states.escalation(tenant.organization)
    tenant.post(f"{ESCALATIONS}/{second.pk}/acknowledge", {})

    listed = tenant.get(ESCALATIONS).json()
    assert [item["id"] for item in listed["results"]] == [str(second.pk), str(first.pk)]
    by_status = tenant.get(ESCALATIONS, {"status": "open"}).json()["results"]
    assert [item["id"] for item in by_status] == [str(first.pk)]
    by_run = tenant.get(ESCALATIONS, {"run": str(second.run_id)}).json()["results"]
    assert [item["id"] for item in by_run] == [str(second.pk)]
    refused = tenant.get(ESCALATIONS, {"status": "closed"})
    assert refused.status_code == 400
    assert refused.json()["details"][0]["path"] == "status"


def test_acknowledge_records_who_and_is_idempotent(tenant: Tenant) -> None:
    ticket = states.escalation(tenant.organization)

    first = tenant.post(f"{ESCALATIONS}/{ticket.pk}/acknowledge", {"note": "on it"})
    again = tenant.post(f"{ESCALATIONS}/{ticket.pk}/acknowledge", {})

    assert first.status_code == 200, first.json()
    assert first.json()["status"] == "acknowledged"
    assert first.json()["acknowledged_by"].startswith("api:")
    assert first.json()["note"] == "on it"
    assert again.json()["acknowledged_at"] == first.json()["acknowledged_at"]


@pytest.mark.parametrize(
    ("action", "run_status"),
    [("resume", "running"), ("retry", "retrying"), ("replan", "running"), ("cancel", "cancelled")],
)
def test_each_action_takes_the_run_out_of_escalated(
    tenant: Tenant, action: str, run_status: str
) -> None:
    ticket = states.escalation(tenant.organization)

    response = tenant.post(
        f"{ESCALATIONS}/{ticket.pk}/resolve", {"action": action, "note": "decided"}
    )

    assert response.status_code == 200, response.json()
    body = response.json()
    assert (body["status"], body["resolution"], body["note"]) == ("resolved", action, "decided")
    assert body["resolved_by"].startswith("api:")
    assert Run.objects.get(pk=ticket.run_id).status == run_status


def test_an_unknown_action_is_a_400_and_changes_nothing(tenant: Tenant) -> None:
    ticket = states.escalation(tenant.organization)

    response = tenant.post(f"{ESCALATIONS}/{ticket.pk}/resolve", {"action": "ignore"})

    assert response.status_code == 400
    assert response.json()["code"] == "invalid_request"
    assert response.json()["details"][0]["path"] == "action"
    missing = tenant.post(f"{ESCALATIONS}/{ticket.pk}/resolve", {})
    assert missing.status_code == 400
    assert EscalationTicket.objects.get(pk=ticket.pk).status == "open"


def test_resolving_a_resolved_ticket_is_a_409(tenant: Tenant) -> None:
    ticket = states.escalation(tenant.organization)
    tenant.post(f"{ESCALATIONS}/{ticket.pk}/resolve", {"action": "resume"})

    again = tenant.post(f"{ESCALATIONS}/{ticket.pk}/resolve", {"action": "cancel"})
    acknowledged = tenant.post(f"{ESCALATIONS}/{ticket.pk}/acknowledge", {})

    assert again.status_code == 409
    assert again.json()["code"] == "escalation_resolved"
    assert acknowledged.status_code == 409
    assert Run.objects.get(pk=ticket.run_id).status == "running"


def test_a_re_plan_past_the_cap_is_a_409(tenant: Tenant) -> None:
    ticket = states.escalation(tenant.organization)
    Run.objects.filter(pk=ticket.run_id).update(replan_count=2)

    response = tenant.post(f"{ESCALATIONS}/{ticket.pk}/resolve", {"action": "replan"})

    assert response.status_code == 409
    assert response.json()["code"] == "replan_limit_reached"


def test_a_run_shows_its_replan_count(tenant: Tenant) -> None:
    ticket = states.escalation(tenant.organization)
    tenant.post(f"{ESCALATIONS}/{ticket.pk}/resolve", {"action": "replan"})
    assert tenant.get(f"/api/v1/runs/{ticket.run_id}").json()["replan_count"] == 1
