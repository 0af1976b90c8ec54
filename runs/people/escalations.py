"""Escalations to people (docs/escalation.md): a person escalates a run, acknowledges a
ticket, resolves it; the worker tells on-call. One service function per operation,
called by the API, the admin and the worker's notification task.

A ticket is opened by the engine (``runs.engine.policy``: error_burst, error_rate,
backoff_exceeded, attempts_exhausted) or by an operator (`operator`). Resolving it takes
the run out of ESCALATED:

- ``resume``: carry on where it stopped; failed steps get their retries again;
- ``retry``: the attempt fails (with the ticket's reason) and a new one starts, with its
  own reservation (402 without the credits, 409 once `max_attempts` are used: then
  nothing changes);
- ``replan``: the agents holding the failures are replaced by what the run's planner
  proposes (``runs.people.replanning``); 409 `replan_limit_reached` past `max_replans`;
- ``cancel``: cancelled, unused credits refunded.

A run that ends any other way while escalated (its timeout, a cancel, a failure that
cannot wait) resolves its ticket as it ends (``runs.services``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Count, F, Min, Q, QuerySet
from django.utils import timezone

from billing.models import Organization
from common.text import storable_text
from runs import services
from runs.engine.control import redispatch
from runs.engine.failure import supersede
from runs.engine.policy import (
    OPEN_TICKET,
    escalate,
    escalation_limits,
    failures_of,
    failures_shown,
    fresh_budgets,
    replan_limits,
    request_replan,
)
from runs.models import (
    Agent,
    EscalationReason,
    EscalationStatus,
    EscalationTicket,
    EventKind,
    Notification,
    NotificationChannel,
    ReplanTrigger,
    Resolution,
    Run,
    Severity,
    Step,
)
from runs.outbox import Outbox
from runs.states import (
    NODE_OPEN,
    RUN_TERMINAL,
    STEP_OPEN,
    InvalidTransition,
    RunStatus,
    StepStatus,
)
from runs.transitions import record_event, transition

ACTIONS = (Resolution.RESUME, Resolution.RETRY, Resolution.REPLAN, Resolution.CANCEL)


class EscalationNotFound(Exception):
    code = "not_found"


class EscalationResolved(Exception):
    """The ticket was resolved already: a second resolution is refused (409)."""

    code = "escalation_resolved"


class ReplanLimitReached(Exception):
    code = "replan_limit_reached"


def _note(text: str) -> str:
    return storable_text(text.strip()[:2000])


# --------------------------------------------------------------------------- reading
def escalation_list(
    *, organization: Organization, status: str | None = None, run_id: Any = None
) -> QuerySet[EscalationTicket]:
    """The organization's tickets, newest first, optionally by status and run."""
    tickets = EscalationTicket.objects.filter(organization=organization)
    if status:
        tickets = tickets.filter(status=status)
    if run_id is not None:
        tickets = tickets.filter(run_id=run_id)
    return tickets.order_by("-opened_at", "-id")


def escalation_get(*, organization: Organization | None, ticket_id: Any) -> EscalationTicket:
    tickets = EscalationTicket.objects.all()
    if organization is not None:
        tickets = tickets.filter(organization=organization)
    ticket = tickets.filter(pk=ticket_id).first()
    if ticket is None:
        raise EscalationNotFound(f"escalation {ticket_id} not found")
    return ticket


def open_escalations(organization: Organization | None = None) -> int:
    tickets = EscalationTicket.objects.filter(status__in=OPEN_TICKET)
    if organization is not None:
        tickets = tickets.filter(organization=organization)
    return tickets.count()


# --------------------------------------------------------------------------- a person
@transaction.atomic
def escalation_open(
    *,
    run_id: Any,
    organization: Organization | None = None,
    actor: str,
    note: str = "",
    severity: str = Severity.MEDIUM,
) -> EscalationTicket:
    """An operator hands a RUNNING run to people (reason `operator`); a run already
    escalated returns its open ticket."""
    run = services.lock_run(run_id, organization)
    if run.status == RunStatus.ESCALATED:
        found = EscalationTicket.objects.filter(run=run, status__in=OPEN_TICKET).first()
        if found is not None:
            return found
    if run.status != RunStatus.RUNNING:
        raise InvalidTransition("run", run.status, RunStatus.ESCALATED)
    now = timezone.now()
    ticket = escalate(
        run,
        reason=EscalationReason.OPERATOR,
        errors=failures_shown(run, now - escalation_limits(run).window),
        actor=actor,
        now=now,
        severity=severity,
        note=_note(note),
    )
    assert ticket is not None
    return ticket


def _lock(ticket_id: Any, organization: Organization | None) -> tuple[Run, EscalationTicket]:
    """The ticket's run, then the ticket, locked (the run first: the lock order)."""
    found = escalation_get(organization=organization, ticket_id=ticket_id)
    run = services.lock_run(found.run_id)
    return run, EscalationTicket.objects.select_for_update().get(pk=found.pk)


@transaction.atomic
def escalation_acknowledge(
    *, ticket_id: Any, organization: Organization | None = None, actor: str, note: str = ""
) -> EscalationTicket:
    """Someone is on it. Acknowledging twice changes nothing; a resolved ticket: 409."""
    run, ticket = _lock(ticket_id, organization)
    if ticket.status == EscalationStatus.RESOLVED:
        raise EscalationResolved(f"escalation {ticket.pk} was resolved ({ticket.resolution})")
    if ticket.status == EscalationStatus.ACKNOWLEDGED:
        return ticket
    ticket.status = EscalationStatus.ACKNOWLEDGED
    ticket.acknowledged_at, ticket.acknowledged_by = timezone.now(), actor
    if note:
        ticket.note = _note(note)
    ticket.save(update_fields=["status", "acknowledged_at", "acknowledged_by", "note"])
    record_event(
        run,
        EventKind.ESCALATION,
        actor=actor,
        message=f"escalation {ticket.pk} acknowledged",
        payload={"ticket": str(ticket.pk), "status": ticket.status},
    )
    return ticket


@transaction.atomic
def escalation_resolve(
    *,
    ticket_id: Any,
    action: str,
    organization: Organization | None = None,
    actor: str,
    note: str = "",
) -> EscalationTicket:
    """Resolve the ticket with ``action`` (resume, retry, replan, cancel); the run leaves
    ESCALATED accordingly, in this transaction. A resolved ticket: 409."""
    if action not in ACTIONS:
        raise ValueError(f"unknown action {action!r}: one of {', '.join(ACTIONS)}")
    run, ticket = _lock(ticket_id, organization)
    if ticket.status == EscalationStatus.RESOLVED:
        raise EscalationResolved(f"escalation {ticket.pk} was resolved ({ticket.resolution})")
    if run.status != RunStatus.ESCALATED and not (
        action == Resolution.CANCEL and run.status not in RUN_TERMINAL
    ):
        raise InvalidTransition("run", run.status, RunStatus.RUNNING, "the run is not escalated")
    now = timezone.now()
    # Resolved first: the run's end below (retry, cancel) closes only tickets still open.
    ticket.status, ticket.resolution = EscalationStatus.RESOLVED, action
    ticket.resolved_at, ticket.resolved_by = now, actor
    if note:
        ticket.note = _note(note)
    ticket.save(update_fields=["status", "resolution", "resolved_at", "resolved_by", "note"])
    record_event(
        run,
        EventKind.ESCALATION,
        actor=actor,
        message=f"escalation {ticket.pk} resolved: {action}",
        payload={"ticket": str(ticket.pk), "resolution": action, "note": ticket.note},
    )
    if action == Resolution.RESUME:
        _resume(run, actor, now)
    elif action == Resolution.RETRY:
        services.run_fail(
            run_id=run.pk,
            code=ticket.reason,
            message=f"escalation {ticket.pk} resolved by a new attempt ({actor})",
            actor=actor,
        )
        services.run_retry(run_id=run.pk, actor=actor)
    elif action == Resolution.REPLAN:
        _replan(run, ticket, actor, now)
    else:
        services.run_cancel(
            run_id=run.pk,
            reason=_note(note) or f"escalation {ticket.pk} resolved: cancel",
            actor=actor,
        )
    return ticket


def _back_to_running(run: Run, actor: str, now: Any, message: str) -> Run:
    return transition(
        Run,
        run.pk,
        RunStatus.RUNNING,
        actor=actor,
        message=message,
        now=now,
        updates={"last_heartbeat": now},
    ).obj


def _resume(run: Run, actor: str, now: Any) -> None:
    """Where it stopped: the held steps, with fresh budgets, and whatever else was
    ready, dispatched again."""
    given = fresh_budgets(run)
    run = _back_to_running(run, actor, now, f"resumed after escalation ({given} step(s) retried)")
    redispatch(run, now)


def _replan(run: Run, ticket: EscalationTicket, actor: str, now: Any) -> None:
    """The agents holding the failures make way for what the planner proposes."""
    limits = replan_limits(run)
    if run.replan_count >= limits.max_replans:
        raise ReplanLimitReached(
            f"run {run.pk} has made {run.replan_count} of {limits.max_replans} re-plans"
        )
    run = _back_to_running(run, actor, now, f"re-planning after escalation {ticket.pk}")
    failures = failures_of(run)
    listed = [entry["step"] for entry in ticket.errors if entry.get("step")]
    # The steps still open that failed: those the ticket lists, and those held for it.
    failing = Step.objects.filter(run=run, attempt_number=run.attempt_number).filter(
        Q(pk__in=listed, status__in=STEP_OPEN)
        | Q(status=StepStatus.PENDING, failures__gt=F("retry_base_failures"))
    )
    agents = list(
        Agent.objects.filter(
            pk__in=failing.values("task__agent_id"), status__in=NODE_OPEN
        ).order_by("position")
    )
    failures["superseded"] = [agent.name for agent in agents]
    # The hold first: replacing the agents must not let the run finish.
    request_replan(run, trigger=ReplanTrigger.OPERATOR, failures=failures, actor=actor, now=now)
    outbox = Outbox()
    for agent in agents:
        supersede(run, agent, f"replaced by re-plan {run.replan_count} ({actor})", outbox)
    run.refresh_from_db()
    redispatch(run, now)


# --------------------------------------------------------------------------- on-call
def tickets_to_notify(run_id: Any) -> list[Any]:
    """The run's tickets whose on-call notice is not done."""
    return list(
        EscalationTicket.objects.filter(run_id=run_id, notified_at__isnull=True).values_list(
            "pk", flat=True
        )
    )


@contextmanager
def notifying(ticket_id: Any) -> Iterator[EscalationTicket | None]:
    """The ticket, locked while its notices go out (a duplicate message skips it: None),
    with its organization and run; None too once it is done."""
    with transaction.atomic():
        yield (
            EscalationTicket.objects.select_for_update(skip_locked=True, of=("self",))
            .select_related("organization", "run")
            .filter(pk=ticket_id, notified_at__isnull=True)
            .first()
        )


def channels_due(ticket: EscalationTicket) -> dict[str, int]:
    """The channels the organization set up that have not delivered, each with the
    attempts it has made (those that made ESCALATION_WEBHOOK_ATTEMPTS are given up)."""
    org = ticket.organization
    wanted = []
    if org.escalation_webhook_url:
        wanted.append(NotificationChannel.WEBHOOK)
    if org.oncall_emails:
        wanted.append(NotificationChannel.EMAIL)
    made = dict(
        Notification.objects.filter(ticket=ticket)
        .values("channel")
        .annotate(n=Count("*"))
        .values_list("channel", "n")
    )
    delivered = set(
        Notification.objects.filter(ticket=ticket, delivered=True).values_list("channel", flat=True)
    )
    return {
        channel: made.get(channel, 0)
        for channel in wanted
        if channel not in delivered and made.get(channel, 0) < settings.ESCALATION_WEBHOOK_ATTEMPTS
    }


def notification_record(
    *,
    ticket: EscalationTicket,
    channel: str,
    attempt: int,
    target: str,
    delivered: bool,
    status_code: int | None = None,
    error: str = "",
    duration_ms: int = 0,
) -> Notification:
    """One delivery attempt, as it went."""
    notification = Notification.objects.create(
        ticket=ticket,
        channel=channel,
        attempt=attempt,
        target=target[:2000],
        delivered=delivered,
        status_code=status_code,
        error=storable_text(error[:2000]),
        duration_ms=max(duration_ms, 0),
    )
    outcome = "delivered" if delivered else f"failed: {error or status_code}"
    record_event(
        ticket.run,
        EventKind.ESCALATION,
        actor="worker",
        message=f"escalation {ticket.pk}: {channel} attempt {attempt} {outcome}"[:2000],
        payload={
            "ticket": str(ticket.pk),
            "channel": channel,
            "attempt": attempt,
            "delivered": delivered,
            "status_code": status_code,
        },
    )
    return notification


def ticket_notified(ticket: EscalationTicket) -> None:
    """Every channel delivered or gave up: on-call was told (as far as it could be)."""
    EscalationTicket.objects.filter(pk=ticket.pk).update(notified_at=timezone.now())


def notice(ticket: EscalationTicket) -> dict[str, Any]:
    """What on-call is told of a ticket (the webhook's body, the e-mail's content)."""
    run = ticket.run
    return {
        "type": "escalation.opened",
        "id": str(ticket.pk),
        "created_at": ticket.opened_at.isoformat(),
        "organization": str(ticket.organization_id),
        "escalation": {
            "id": str(ticket.pk),
            "status": ticket.status,
            "reason": ticket.reason,
            "severity": ticket.severity,
            "errors": ticket.errors,
            "opened_at": ticket.opened_at.isoformat(),
            "note": ticket.note,
        },
        "run": {
            "id": str(run.pk),
            "name": run.name,
            "status": run.status,
            "attempt_number": run.attempt_number,
        },
        "links": {
            "escalation": f"{settings.PUBLIC_BASE_URL}/api/v1/escalations/{ticket.pk}",
            "run": f"{settings.PUBLIC_BASE_URL}/api/v1/runs/{run.pk}",
            "admin": f"{settings.PUBLIC_BASE_URL}/admin/runs/escalationticket/{ticket.pk}/change/",
        },
    }


def first_unnotified() -> datetime | None:
    """When the oldest ticket whose notice is not done was opened."""
    rows = EscalationTicket.objects.filter(notified_at__isnull=True)
    opened: datetime | None = rows.aggregate(at=Min("opened_at"))["at"]
    return opened


def overdue_notices(older_than: timedelta, limit: int) -> list[Any]:
    """Runs with a ticket whose notice should have gone by now (its message lost)."""
    since = timezone.now() - older_than
    return list(
        EscalationTicket.objects.filter(notified_at__isnull=True, opened_at__lt=since)
        .exclude(notifications__created_at__gte=since)
        .values_list("run_id", flat=True)
        .distinct()[:limit]
    )
