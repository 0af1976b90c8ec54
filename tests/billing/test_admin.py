"""Billing in the admin: balances shown, credits granted through the service, ledger read-only."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.test import Client

from billing.models import LedgerEntry, Organization
from runs.engine.start import run_start
from tests import factories

pytestmark = pytest.mark.django_db


def test_organization_page_shows_balances(operator: Client) -> None:
    organization = factories.org(credits=42)
    run = factories.run(organization, credits=2)
    run_start(run_id=run.pk)

    page = operator.get(f"/admin/billing/organization/{organization.pk}/change/").content.decode()

    assert "40.000000" in page  # available
    assert "2.000000" in page  # reserved


def test_grant_action_asks_amount_and_reason_and_grants_once(operator: Client) -> None:
    organization = factories.org(credits=0)
    selected = {"action": "grant_credits", "_selected_action": [str(organization.pk)]}

    form_page = operator.post("/admin/billing/organization/", selected).content.decode()
    key = form_page.split('name="idempotency_key" value="')[1].split('"')[0]
    submit = {**selected, "apply": "1", "amount": "12.5", "reason": "pilot", "idempotency_key": key}
    operator.post("/admin/billing/organization/", submit)
    operator.post("/admin/billing/organization/", submit)  # a double submit

    organization = Organization.objects.get(pk=organization.pk)
    assert organization.credits_available == Decimal("12.5")
    entry = LedgerEntry.objects.get(organization=organization)
    assert (entry.type, entry.reason, entry.actor) == ("grant", "pilot", "admin:ops")


def test_ledger_is_read_only_and_filterable(operator: Client) -> None:
    organization = factories.org(credits=5)
    run = factories.run(organization, credits=1)
    run_start(run_id=run.pk)
    entry = LedgerEntry.objects.get(run=run)

    assert operator.get("/admin/billing/ledgerentry/add/").status_code == 403
    change = operator.post(f"/admin/billing/ledgerentry/{entry.pk}/change/", {"amount": "9"})
    assert change.status_code == 403
    assert operator.post(f"/admin/billing/ledgerentry/{entry.pk}/delete/").status_code == 403
    by_type = operator.get("/admin/billing/ledgerentry/", {"type__exact": "reserve"})
    assert by_type.status_code == 200
    assert "1 ledger entry" in by_type.content.decode() or str(run.pk) in by_type.content.decode()
    by_run = operator.get("/admin/billing/ledgerentry/", {"run__id__exact": str(run.pk)})
    assert by_run.status_code == 200
    by_org = operator.get(
        "/admin/billing/ledgerentry/", {"organization__id__exact": str(organization.pk)}
    )
    assert by_org.status_code == 200
    assert LedgerEntry.objects.get(pk=entry.pk).amount == Decimal(1)
