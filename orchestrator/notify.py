"""Telling on-call that a run escalated (docs/escalation.md#notifications): a signed
webhook and e-mail, each attempt recorded, retried with backoff by the task that calls
``notify_run``.

The webhook is a JSON POST to the organization's URL, through ``orchestrator.outbound``
(the address guard, HTTP_TOOL_ALLOWED_NETWORKS; ESCALATION_WEBHOOK_TIMEOUT for the whole
exchange; at most ANSWER_READ_BYTES of the answer read), with

    X-Orchestrator-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">

under the organization's webhook secret: a receiver recomputes it over the raw body,
compares in constant time and refuses a `t` too far from its clock (a replay).
``X-Orchestrator-Delivery`` names the attempt and ``X-Orchestrator-Event`` what
happened; the body's `id` is the ticket's, the same on every attempt, for receivers that
deduplicate. A 2xx answer is delivered; anything else is retried.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import smtplib
import time
import uuid
from typing import Any

import httpx
from django.conf import settings
from django.core.mail import send_mail

from billing.secrets import SecretUnreadable, webhook_secret
from orchestrator import outbound
from orchestrator.netguard import ONCALL_WEBHOOK, AddressNotAllowed
from runs.models import EscalationTicket, NotificationChannel
from runs.people import escalations

logger = logging.getLogger(__name__)
SIGNATURE_HEADER = "X-Orchestrator-Signature"
# How much of on-call's answer is read: its first 200 characters explain a failure.
ANSWER_READ_BYTES = 4096


def signature(secret: str, timestamp: int, body: bytes) -> str:
    """The header's value for ``body`` sent at ``timestamp``."""
    signed = f"{timestamp}.".encode() + body
    digest = hmac.new(secret.encode("utf-8", "surrogatepass"), signed, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={digest}"


def notify_run(run_id: Any) -> float | None:
    """Deliver what is due of the run's tickets' notices; return in how many seconds to
    try again (a channel failed and has attempts left), or None when nothing is left."""
    again: float | None = None
    for ticket_id in escalations.tickets_to_notify(run_id):
        wait = notify_ticket(ticket_id)
        if wait is not None:
            again = wait if again is None else min(again, wait)
    return again


def notify_ticket(ticket_id: Any) -> float | None:
    with escalations.notifying(ticket_id) as ticket:
        if ticket is None:
            return None  # done, or another worker is on it
        due = escalations.channels_due(ticket)
        for channel, made in due.items():
            attempt = made + 1
            if channel == NotificationChannel.WEBHOOK:
                _webhook(ticket, attempt)
            else:
                _email(ticket, attempt)
        left = escalations.channels_due(ticket)
        if not left:
            escalations.ticket_notified(ticket)
            return None
        fewest: int = min(left.values())
        backoff = float(settings.ESCALATION_WEBHOOK_BACKOFF)
        return backoff * float(2 ** max(fewest - 1, 0))


def _webhook(ticket: EscalationTicket, attempt: int) -> None:
    url = ticket.organization.escalation_webhook_url
    body = json.dumps(escalations.notice(ticket), separators=(",", ":"), sort_keys=True).encode()
    delivery = uuid.uuid4()
    started = time.monotonic()
    status: int | None = None
    error = ""
    try:
        secret = webhook_secret(organization_id=ticket.organization_id)
        headers = {
            "Content-Type": "application/json",
            "User-Agent": "run-orchestrator",
            "X-Orchestrator-Event": "escalation.opened",
            "X-Orchestrator-Delivery": str(delivery),
        }
        if secret:
            headers[SIGNATURE_HEADER] = signature(secret, int(time.time()), body)
        with outbound.exchange(
            "POST",
            url,
            deadline=started + float(settings.ESCALATION_WEBHOOK_TIMEOUT),
            refused=ONCALL_WEBHOOK,
            content=body,
            headers=headers,
        ) as response:
            status = response.status_code
            excerpt = outbound.excerpt(response, ANSWER_READ_BYTES)
        if not 200 <= status < 300:
            error = f"HTTP {status}: {excerpt}"
    except httpx.TimeoutException:
        status = None  # an answer cut short is no answer
        timeout = settings.ESCALATION_WEBHOOK_TIMEOUT
        error = f"timeout: no whole answer within ESCALATION_WEBHOOK_TIMEOUT ({timeout:g} s)"
    except (AddressNotAllowed, SecretUnreadable) as exc:
        error = str(exc)
    except (httpx.HTTPError, OSError) as exc:  # recorded and retried, never raised
        error = f"{type(exc).__name__}: {exc}"
    escalations.notification_record(
        ticket=ticket,
        channel=NotificationChannel.WEBHOOK,
        attempt=attempt,
        target=url,
        delivered=not error,
        status_code=status,
        error=error,
        duration_ms=int((time.monotonic() - started) * 1000),
    )


def _email(ticket: EscalationTicket, attempt: int) -> None:
    notice = escalations.notice(ticket)
    run, escalation = notice["run"], notice["escalation"]
    addresses = list(ticket.organization.oncall_emails)
    lines = [
        f"Run {run['name']} ({run['id']}) escalated: {escalation['reason']}, "
        f"severity {escalation['severity']}.",
        "",
        "Failures:",
        *[
            f"- {error.get('path', '')} attempt {error.get('attempt', '')}: "
            f"{error.get('code', '')}: {error.get('message', '')}"
            for error in escalation["errors"]
        ],
        "",
        f"Escalation: {notice['links']['escalation']}",
        f"Admin: {notice['links']['admin']}",
        "Resolve it with resume, retry, replan or cancel.",
    ]
    started = time.monotonic()
    error = ""
    try:
        send_mail(
            subject=f"[orchestrator] {escalation['severity']}: run {run['name']} escalated "
            f"({escalation['reason']})",
            message="\n".join(lines),
            from_email=settings.DEFAULT_FROM_EMAIL,
            recipient_list=addresses,
        )
    except (smtplib.SMTPException, OSError) as exc:  # recorded and retried, never raised
        error = f"{type(exc).__name__}: {exc}"
    escalations.notification_record(
        ticket=ticket,
        channel=NotificationChannel.EMAIL,
        attempt=attempt,
        target=", ".join(addresses),
        delivered=not error,
        error=error,
        duration_ms=int((time.monotonic() - started) * 1000),
    )
