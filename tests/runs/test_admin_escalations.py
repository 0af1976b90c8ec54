"""Escalations in the admin: a run escalated and resolved from its page, a ticket
acknowledged and resolved from its own, each through the services the API calls and
recorded with the operator's name; the organization's on-call set in its form."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from billing.models import Organization
from billing.secrets import webhook_secret
from runs.models import EscalationTicket, Run
from runs.selectors import run_history
from tests import factories
from tests.api import states

pytestmark = pytest.mark.django_db


def act(operator: Client, url: str, action: str, *rows: Any) -> Any:
    return operator.post(
        url, {"action": action, "_selected_action": [str(row.pk) for row in rows]}, follow=True
    )


def test_an_operator_escalates_a_run_and_resolves_it_from_the_run_list(operator: Client) -> None:
    run = states.running(factories.org())

    act(operator, "/admin/runs/run/", "escalate_runs", run)

    ticket = EscalationTicket.objects.get(run=run)
    assert (ticket.reason, Run.objects.get(pk=run.pk).status) == ("operator", "escalated")
    page = operator.get(f"/admin/runs/run/{run.pk}/change/")
    assert f"/admin/runs/escalationticket/{ticket.pk}/change/".encode() in page.content

    act(operator, "/admin/runs/run/", "resolve_resume", run)

    ticket.refresh_from_db()
    assert (ticket.status, ticket.resolution, ticket.resolved_by) == (
        "resolved",
        "resume",
        "admin:ops",
    )
    assert Run.objects.get(pk=run.pk).status == "running"


def test_a_ticket_is_acknowledged_then_resolved_from_its_list(operator: Client) -> None:
    ticket = states.escalation(factories.org())

    act(operator, "/admin/runs/escalationticket/", "acknowledge", ticket)
    act(operator, "/admin/runs/escalationticket/", "resolve_cancel", ticket)

    ticket.refresh_from_db()
    assert (ticket.acknowledged_by, ticket.resolution) == ("admin:ops", "cancel")
    assert Run.objects.get(pk=ticket.run_id).status == "cancelled"
    actors = set(
        run_history(ticket.run_id).filter(kind="escalation").values_list("actor", flat=True)
    )
    assert "admin:ops" in actors


def test_a_resolved_ticket_is_refused_with_a_message_not_an_error(operator: Client) -> None:
    ticket = states.escalation(factories.org())
    act(operator, "/admin/runs/escalationticket/", "resolve_resume", ticket)

    page = act(operator, "/admin/runs/escalationticket/", "resolve_cancel", ticket)

    assert page.status_code == 200
    assert b"was resolved" in page.content
    assert Run.objects.get(pk=ticket.run_id).status == "running"


def test_the_organizations_on_call_is_set_in_its_form(operator: Client) -> None:
    organization = factories.org(name="acme")
    url = f"/admin/billing/organization/{organization.pk}/change/"
    form = {
        "name": "acme",
        "webhook_url": "https://pager.example/hooks/orchestrator",
        "webhook_secret": "",
        "oncall_emails": "one@example.com, two@example.com",
        "api_keys-TOTAL_FORMS": "0",
        "api_keys-INITIAL_FORMS": "0",
    }

    refused = operator.post(url, form)
    assert refused.status_code == 200
    assert b"a webhook needs a signing secret" in refused.content

    saved = operator.post(url, {**form, "webhook_secret": "s3cret"})
    assert saved.status_code == 302, saved.content[:2000]
    organization = Organization.objects.get(pk=organization.pk)
    assert organization.escalation_webhook_url == "https://pager.example/hooks/orchestrator"
    assert organization.oncall_emails == ["one@example.com", "two@example.com"]
    assert webhook_secret(organization_id=organization.pk) == "s3cret"
    assert b"s3cret" not in operator.get(url).content  # never shown again

    kept = operator.post(url, {**form, "oncall_emails": "one@example.com"})
    assert kept.status_code == 302
    assert webhook_secret(organization_id=organization.pk) == "s3cret"
