"""Telling on-call (orchestrator.notify), in process: e-mail through Django's backend
(the test outbox), the webhook to a local HTTP server with a signature the test checks,
retries recorded attempt by attempt, and giving up after the last one."""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any

import pytest
from django.core import mail

from billing.secrets import oncall_set, secrets_rotate, webhook_secret
from orchestrator import notify
from runs.models import EscalationTicket, Notification
from runs.selectors import run_history
from tests import factories
from tests.api import states
from tests.http_fixture import DrippingReceiver, HttpServer

pytestmark = pytest.mark.django_db
SECRET = "whsec-for-tests"


def verify(secret: str, header: str, body: bytes) -> int:
    """What a receiver does: recompute the HMAC over "<t>.<body>" and compare."""
    parts = dict(part.split("=", 1) for part in header.split(","))
    expected = hmac.new(
        secret.encode(), f"{parts['t']}.".encode() + body, hashlib.sha256
    ).hexdigest()
    assert hmac.compare_digest(expected, parts["v1"]), "signature does not verify"
    return int(parts["t"])


def test_on_call_is_e_mailed_once(settings: Any) -> None:
    organization = factories.org()
    oncall_set(organization=organization, emails=["pager@example.com", " ops@example.com "])
    ticket = states.escalation(organization)

    assert notify.notify_run(ticket.run_id) is None

    assert len(mail.outbox) == 1
    message = mail.outbox[0]
    assert sorted(message.to) == ["ops@example.com", "pager@example.com"]
    assert "escalated (operator)" in message.subject
    assert f"/api/v1/escalations/{ticket.pk}" in message.body
    sent = Notification.objects.get(ticket=ticket)
    assert (sent.channel, sent.attempt, sent.delivered) == ("email", 1, True)
    assert EscalationTicket.objects.get(pk=ticket.pk).notified_at is not None
    assert notify.notify_run(ticket.run_id) is None  # told once
    assert len(mail.outbox) == 1


def test_the_webhook_is_signed_retried_after_a_500_and_recorded(
    http_server: HttpServer, settings: Any
) -> None:
    settings.ESCALATION_WEBHOOK_BACKOFF = 7
    http_server.respond("/hooks/oncall", status=500, times=1)
    http_server.respond("/hooks/oncall", status=204)
    organization = factories.org()
    oncall_set(
        organization=organization,
        webhook_url=f"{http_server.url}/hooks/oncall",
        webhook_secret=SECRET,
    )
    ticket = states.escalation(organization)

    assert notify.notify_run(ticket.run_id) == 7.0  # the first attempt failed: again in 7 s
    assert notify.notify_run(ticket.run_id) is None

    first, second = http_server.requests
    assert first.body == second.body  # the same notice, the same id, every attempt
    assert first.headers["x-orchestrator-delivery"] != second.headers["x-orchestrator-delivery"]
    for request in (first, second):
        verify(SECRET, request.headers["x-orchestrator-signature"], request.body)
        assert request.headers["x-orchestrator-event"] == "escalation.opened"
    notice = json.loads(second.body)
    assert notice["id"] == str(ticket.pk)
    assert notice["escalation"]["reason"] == "operator"
    assert notice["run"]["id"] == str(ticket.run_id)
    attempts = list(
        Notification.objects.filter(ticket=ticket).values_list(
            "attempt", "delivered", "status_code"
        )
    )
    assert attempts == [(1, False, 500), (2, True, 204)]
    assert (
        run_history(ticket.run).filter(kind="escalation", payload__channel="webhook").count() == 2
    )


def test_a_signature_made_with_another_secret_does_not_verify(http_server: HttpServer) -> None:
    http_server.respond("/hook", status=200)
    organization = factories.org()
    oncall_set(
        organization=organization, webhook_url=f"{http_server.url}/hook", webhook_secret=SECRET
    )
    notify.notify_run(states.escalation(organization).run_id)
    (request,) = http_server.requests
    with pytest.raises(AssertionError, match="does not verify"):
        verify("another-secret", request.headers["x-orchestrator-signature"], request.body)
    with pytest.raises(AssertionError, match="does not verify"):
        verify(SECRET, request.headers["x-orchestrator-signature"], request.body + b" ")


def test_a_webhook_that_keeps_failing_is_given_up_after_the_last_attempt(
    http_server: HttpServer, settings: Any
) -> None:
    settings.ESCALATION_WEBHOOK_ATTEMPTS = 2
    http_server.respond("/down", status=503)
    organization = factories.org()
    oncall_set(
        organization=organization, webhook_url=f"{http_server.url}/down", webhook_secret=SECRET
    )
    ticket = states.escalation(organization)

    assert notify.notify_run(ticket.run_id) is not None
    assert notify.notify_run(ticket.run_id) is None  # the second and last attempt failed

    assert Notification.objects.filter(ticket=ticket, delivered=False).count() == 2
    assert EscalationTicket.objects.get(pk=ticket.pk).notified_at is not None


def test_a_webhook_to_an_address_the_guard_refuses_is_recorded_not_sent(settings: Any) -> None:
    settings.HTTP_TOOL_ALLOWED_NETWORKS = []
    settings.ESCALATION_WEBHOOK_ATTEMPTS = 1
    organization = factories.org()
    oncall_set(
        organization=organization, webhook_url="http://127.0.0.1:9/hook", webhook_secret=SECRET
    )
    ticket = states.escalation(organization)

    notify.notify_run(ticket.run_id)

    refused = Notification.objects.get(ticket=ticket)
    assert not refused.delivered
    assert "loopback address" in refused.error


@pytest.mark.timeout(30)  # read by read, a dripping receiver would hold it for an hour
def test_a_webhook_whose_receiver_drips_its_headers_is_cut_at_the_timeout(
    settings: Any,
) -> None:
    settings.HTTP_TOOL_ALLOWED_NETWORKS = ["127.0.0.1/32"]
    settings.ESCALATION_WEBHOOK_TIMEOUT = 0.5
    settings.ESCALATION_WEBHOOK_ATTEMPTS = 1
    organization = factories.org()
    with DrippingReceiver() as receiver:
        oncall_set(
            organization=organization, webhook_url=f"{receiver.url}/hook", webhook_secret=SECRET
        )
        notify.notify_run(states.escalation(organization).run_id)
        assert receiver.answered == 1

    cut = Notification.objects.get(channel="webhook")
    assert (cut.delivered, cut.status_code) == (False, None)
    assert cut.error == "timeout: no whole answer within ESCALATION_WEBHOOK_TIMEOUT (0.5 s)"
    assert 500 <= cut.duration_ms < 2000


def test_a_webhook_needs_a_secret_and_the_secret_rotates() -> None:
    organization = factories.org()
    with pytest.raises(ValueError, match="signing secret"):
        oncall_set(organization=organization, webhook_url="https://pager.example/hook")
    oncall_set(
        organization=organization, webhook_url="https://pager.example/hook", webhook_secret=SECRET
    )
    before = bytes(
        type(organization).objects.get(pk=organization.pk).escalation_webhook_secret or b""
    )

    assert secrets_rotate() >= 1

    after = bytes(
        type(organization).objects.get(pk=organization.pk).escalation_webhook_secret or b""
    )
    assert after != before
    assert webhook_secret(organization_id=organization.pk) == SECRET
