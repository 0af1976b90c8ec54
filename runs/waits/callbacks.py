"""Asynchronous steps (docs/runners.md, "Asynchronous steps"): callbacks and
polls, and the sweep that keeps every kind of wait moving.

A `callback` step opens a single-use URL, ``/api/v1/callbacks/<token>``: the token is
the credential (no API key), made of the wait's id and a secret of 256 bits of which
only the SHA-256 is stored, compared in constant time. The first post of
``{"status": "completed", "result": ...}`` or ``{"status": "failed", "error": ...}``
ends the step; any later post is refused (409), and so is one after the wait expired
(410) or after the attempt ended otherwise (409).

A `poll` step's URL is read by scheduled messages (``orchestrator.polling``), no worker
held between them; each reading is recorded here, under the run's lock, once per number
(a message delivered twice reads again, but counts once), and ends the step when
``done_when`` or ``failed_when`` holds, when ``max_attempts`` readings were made, or at
the wait's timeout.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Min, Q
from django.utils import timezone

from billing.models import Organization
from billing.pricing import tool_price
from common import tracing
from common.redaction import CALLBACK_PATH
from common.text import storable_text
from common.tools.base import ToolError
from runs.engine.outcomes import Outcome, record
from runs.engine.waiting import Parked
from runs.models import EventKind, Run, Step, StepWait, StepWaitKind, StepWaitStatus
from runs.outbox import after_commit, schedule_poll
from runs.services import lock_run, run_cancel
from runs.states import RUN_TERMINAL, StepStatus
from runs.transitions import record_event
from runs.waits.children import child_ended

W = StepWaitStatus
# How much of a poll's response its wait keeps (and a completed poll step outputs).
POLL_BODY_LIMIT = 100_000


class CallbackNotFound(Exception):
    """No callback has this token (404): unknown, malformed, or a wrong secret."""

    code = "not_found"


class CallbackRefused(Exception):
    """The callback exists but takes no post now (409 used, closed or its organization
    suspended, 410 expired)."""

    def __init__(self, code: str, status: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.status = status
        self.message = message


# --------------------------------------------------------------------------- callbacks
@dataclass(frozen=True)
class Opening:
    """A callback URL made before it is opened: the tool's templates need it first."""

    wait_id: uuid.UUID
    token: str
    digest: str

    @property
    def url(self) -> str:
        return f"{settings.PUBLIC_BASE_URL}{CALLBACK_PATH}{self.token}"


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def new_callback() -> Opening:
    wait_id = uuid.uuid4()
    secret = secrets.token_urlsafe(32)
    return Opening(wait_id, f"{wait_id.hex}.{secret}", _digest(secret))


def open_callback(
    opening: Opening, *, step_id: int, attempt: int, expires_in: float
) -> dict[str, str]:
    """Open ``opening`` for attempt ``attempt`` of ``step_id``, to expire in
    ``expires_in`` seconds: its wait id and URL. Refused (``cancelled``) when the attempt
    no longer runs."""
    with transaction.atomic():
        step = Step.objects.filter(pk=step_id).values("run_id", "status", "attempts").first()
        if step is None or step["status"] != StepStatus.RUNNING or step["attempts"] != attempt:
            raise ToolError("cancelled", "the step no longer runs this attempt", False)
        now = timezone.now()
        StepWait.objects.create(
            id=opening.wait_id,
            run_id=step["run_id"],
            step_id=step_id,
            attempt=attempt,
            kind=StepWaitKind.CALLBACK,
            token_digest=opening.digest,
            expires_at=now + timedelta(seconds=expires_in),
        )
    return {"wait": str(opening.wait_id), "url": opening.url}


def _callback_by_token(token: str) -> StepWait:
    head, _, secret = token.partition(".")
    try:
        wait_id = uuid.UUID(hex=head)
    except ValueError:
        raise CallbackNotFound("no such callback") from None
    wait = StepWait.objects.filter(pk=wait_id, kind=StepWaitKind.CALLBACK).first()
    # The digest of whatever was given is compared, in constant time, even when no wait
    # was found: the answer takes as long either way.
    expected = wait.token_digest if wait is not None else "0" * 64
    if not hmac.compare_digest(expected, _digest(secret)) or wait is None:
        raise CallbackNotFound("no such callback")
    return wait


def receive_callback(token: str, *, status: str, result: Any = None, error: Any = None) -> StepWait:
    """A post to a callback URL: the step completes with ``result`` or fails with
    ``callback_failed`` (retried by its policy: a new URL per attempt)."""
    return _receive(_callback_by_token(token), "callback", status, result, error)


def receive_callback_of(
    *,
    run: Run,
    callback_id: uuid.UUID,
    actor: str,
    status: str,
    result: Any = None,
    error: Any = None,
) -> StepWait:
    """The same post by the run's organization, naming the callback by the id its event
    shows (the URL's token is not shown anywhere it could be read back)."""
    found = StepWait.objects.filter(pk=callback_id, run=run, kind=StepWaitKind.CALLBACK).first()
    if found is None:
        raise CallbackNotFound("no such callback")
    return _receive(found, actor, status, result, error)


def _receive(found: StepWait, actor: str, status: str, result: Any, error: Any) -> StepWait:
    with transaction.atomic():
        run = lock_run(found.run_id, light=True)
        suspended = Organization.objects.filter(
            pk=run.organization_id, suspended_at__isnull=False
        ).exists()
        if suspended:
            # Nothing of a suspended organization moves on (docs/tenants.md), and the
            # URL carries no key to refuse: its run's organization is what is suspended.
            # The wait stays open, to be posted once it is lifted (if not expired by then).
            raise CallbackRefused(
                "organization_suspended",
                409,
                "the organization of this callback's run is suspended; post it again once "
                "the suspension is lifted",
            )
        wait = StepWait.objects.select_for_update().get(pk=found.pk)
        now = timezone.now()
        if wait.status in (W.COMPLETED, W.FAILED):
            raise CallbackRefused("callback_used", 409, "this callback was posted already")
        if wait.status == W.CLOSED:
            raise CallbackRefused("callback_closed", 409, "the step no longer waits for it")
        if wait.expires_at <= now:
            raise CallbackRefused("callback_expired", 410, "this callback has expired")
        running = Step.objects.filter(
            pk=wait.step_id, status=StepStatus.RUNNING, attempts=wait.attempt
        ).exists()
        if not running:
            _end(wait, W.CLOSED, now)
            raise CallbackRefused("callback_closed", 409, "the step no longer waits for it")
        price = tool_price("callback")
        if status == "completed":
            wait.result = result
            _end(wait, W.COMPLETED, now)
            outcome = Outcome(output=result, cost=price)
        else:
            message = storable_text(error if isinstance(error, str) else _text(error))[:2000]
            wait.error = message or "the callback reported a failure"
            _end(wait, W.FAILED, now)
            outcome = Outcome(error=ToolError("callback_failed", wait.error), cost=price)
        record_event(
            run,
            EventKind.WAIT,
            actor=actor,
            message=f"callback received: {status}",
            payload={"wait": str(wait.pk), "status": status},
            entity="step",
            entity_id=str(wait.step_id),
        )
        record(wait.step_id, run.pk, wait.attempt, outcome)
        return wait


def _text(value: Any) -> str:
    return "" if value is None else json.dumps(value, default=str)


def _end(wait: StepWait, status: str, now: datetime) -> None:
    wait.status, wait.ended_at = status, now
    wait.save(update_fields=["status", "ended_at", "result", "error", "polls", "last_response"])
    if tracing.enabled:
        _trace_end(wait, now)


def _trace_end(wait: StepWait, now: datetime) -> None:
    """The step's wait for its callback or poll, a span under the step's attempt from the
    wait's creation to its end (emitted at commit)."""
    stored = Step.objects.filter(pk=wait.step_id).values_list("trace_context", flat=True)
    parent_context = stored.first() or ""
    attributes = {
        "orchestrator.step.id": wait.step_id,
        "orchestrator.attempt": wait.attempt,
        "orchestrator.wait.kind": wait.kind,
        "orchestrator.wait.outcome": wait.status,
        "orchestrator.wait.polls": wait.polls,
    }
    transaction.on_commit(
        lambda: tracing.emit(
            f"wait {wait.kind}",
            parent_context=parent_context,
            started=wait.created_at,
            ended=now,
            attributes=attributes,
        )
    )


# --------------------------------------------------------------------------- polls
@dataclass(frozen=True)
class Reading:
    """One poll of the URL: the response (or why there was none) and what the
    conditions made of it: "done", "failed" or "" (poll again)."""

    response: dict[str, Any]
    verdict: str


def poll_due(wait_id: Any, number: int) -> StepWait | None:
    """The poll wait if reading ``number`` is the next one due, else None (a duplicate
    or late message, or a wait that ended); with its run and organization (``wait.run.
    organization``: whose slot the reading takes, and whether it is suspended)."""
    waits = StepWait.objects.select_related("run__organization")
    wait = waits.filter(pk=wait_id, kind=StepWaitKind.POLL).first()
    if wait is None or wait.status != W.WAITING or wait.polls + 1 != number:
        return None
    return wait


def poll_defer(wait_id: Any, number: int, seconds: float) -> bool:
    """Put reading ``number`` off by ``seconds``, uncounted (its organization is
    suspended, or its step slots are all held): its message is sent again, and its
    ``next_poll_at`` moves with it, so that the sweep does not take it for lost and send
    a second one meanwhile. False when that reading is no longer the one due."""
    with transaction.atomic():
        moved = StepWait.objects.filter(
            pk=wait_id, status=W.WAITING, kind=StepWaitKind.POLL, polls=number - 1
        ).update(next_poll_at=timezone.now() + timedelta(seconds=seconds))
        if moved:
            pk = str(wait_id)
            after_commit(lambda: schedule_poll(pk, number, seconds))
    return bool(moved)


def record_reading(wait_id: Any, number: int, reading: Reading) -> bool:
    """Count reading ``number`` of a poll and end its step, or schedule the next one."""
    with transaction.atomic():
        run_id = StepWait.objects.filter(pk=wait_id).values_list("run_id", flat=True).first()
        if run_id is None:
            return False
        run = lock_run(run_id, light=True)
        wait = StepWait.objects.select_for_update().get(pk=wait_id)
        if wait.status != W.WAITING or wait.polls + 1 != number:
            return False
        now = timezone.now()
        wait.polls = number
        wait.last_response = reading.response
        params = wait.params
        running = Step.objects.filter(
            pk=wait.step_id, status=StepStatus.RUNNING, attempts=wait.attempt
        ).exists()
        price = tool_price("poll")
        outcome: Outcome | None = None
        if not running:
            _end(wait, W.CLOSED, now)
            return False
        if reading.verdict == "done":
            wait.result = {**reading.response, "polls": number}
            _end(wait, W.COMPLETED, now)
            outcome = Outcome(output=wait.result, cost=price)
        elif reading.verdict == "failed":
            wait.error = f"failed_when held on poll {number}: {params['failed_when']}"
            _end(wait, W.FAILED, now)
            outcome = Outcome(error=ToolError("poll_failed", wait.error, False), cost=price)
        elif number >= int(params["max_attempts"]):
            wait.error = f"done_when did not hold in {number} polls"
            _end(wait, W.FAILED, now)
            outcome = Outcome(error=ToolError("poll_exhausted", wait.error, False), cost=price)
        elif now + timedelta(seconds=float(params["interval"])) >= wait.expires_at:
            wait.error = f"the poll timed out after {number} polls"
            _end(wait, W.CLOSED, now)
            outcome = Outcome(error=ToolError("timeout", wait.error), cost=price)
        else:
            interval = float(params["interval"])
            wait.next_poll_at = now + timedelta(seconds=interval)
            wait.save(update_fields=["polls", "last_response", "next_poll_at"])
            pk = str(wait.pk)
            after_commit(lambda: schedule_poll(pk, number + 1, interval))
            return True
        record_event(
            run,
            EventKind.WAIT,
            actor="poll",
            message=f"poll ended after {number} polls: {wait.status}",
            payload={"wait": str(wait.pk), "polls": number, "status": wait.status},
            entity="step",
            entity_id=str(wait.step_id),
        )
        record(wait.step_id, run.pk, wait.attempt, outcome)
        return True


# --------------------------------------------------------------------------- sweep
_LIVE_SYNC_CHILDREN = Parked(
    id="c.id",
    rows="""FROM runs_run AS c JOIN runs_step AS s ON s.id = c.parent_step_id
WHERE c.parent_mode = 'sync' AND c.parent_notified_at IS NULL
  AND s.status = 'running' AND s.attempts = c.parent_step_attempt""",
    clock="c.created_at",
)
# Ended child runs whose parent was not told.
_UNTOLD = Q(parent_run__isnull=False, parent_notified_at__isnull=True, status__in=RUN_TERMINAL)


def next_due() -> datetime | None:
    """The earliest moment ``sweep`` has something to do: its rules, in their order."""
    waits = StepWait.objects.filter(status=W.WAITING)
    lost_after = timedelta(seconds=settings.WAIT_LOST_AFTER)
    polled = waits.filter(kind=StepWaitKind.POLL).aggregate(at=Min("next_poll_at"))["at"]
    untold = Run.objects.filter(_UNTOLD).aggregate(at=Min("status_changed_at"))["at"]
    dues = [
        waits.aggregate(at=Min("expires_at"))["at"],
        polled + lost_after if polled else None,
        untold + lost_after if untold else None,
        _LIVE_SYNC_CHILDREN.next_deadline(),
    ]
    return min((due for due in dues if due is not None), default=None)


def sweep(now: datetime | None = None) -> dict[str, int]:
    """The beat's look at every wait; each fix in its own transaction, safe to repeat:

    - callbacks and polls past their expiry fail their attempt with ``timeout``;
    - polls whose next message is overdue by WAIT_LOST_AFTER are sent again;
    - ended children whose parent was not told (a lost message) are told;
    - sync children that outlived their step's timeout are cancelled, and the step's
      attempt fails with ``timeout`` (retried by its policy, with a new child).
    """
    now = now or timezone.now()
    lost_before = now - timedelta(seconds=settings.WAIT_LOST_AFTER)
    expired = 0
    for wait_id in StepWait.objects.filter(status=W.WAITING, expires_at__lte=now).values_list(
        "pk", flat=True
    )[:1000]:
        expired += _expire(wait_id, now)
    resent = 0
    overdue = StepWait.objects.filter(
        status=W.WAITING, kind=StepWaitKind.POLL, next_poll_at__lt=lost_before
    )
    for wait_id, polls in overdue.values_list("pk", "polls")[:1000]:
        # The lost message's number: a copy that turns up later counts for nothing.
        StepWait.objects.filter(pk=wait_id, polls=polls).update(next_poll_at=now)
        schedule_poll(str(wait_id), polls + 1, 0.0)
        resent += 1
    told = 0
    untold = Run.objects.filter(_UNTOLD, status_changed_at__lt=lost_before)
    for child_id in untold.values_list("pk", flat=True)[:1000]:
        told += child_ended(child_id)
    return {
        "expired": expired,
        "polls_resent": resent,
        "children_told": told,
        "children_timed_out": _time_out_children(now),
    }


def _expire(wait_id: Any, now: datetime) -> int:
    with transaction.atomic():
        run_id = StepWait.objects.filter(pk=wait_id).values_list("run_id", flat=True).first()
        if run_id is None:
            return 0
        lock_run(run_id, light=True)
        wait = StepWait.objects.select_for_update().get(pk=wait_id)
        if wait.status != W.WAITING or wait.expires_at > now:
            return 0
        awaited = "callback" if wait.kind == StepWaitKind.CALLBACK else "poll result"
        wait.error = f"no {awaited} in time"
        _end(wait, W.CLOSED, now)
        error = ToolError("timeout", f"the step timed out waiting: {wait.error}")
        record(wait.step_id, run_id, wait.attempt, Outcome(error=error))
        return 1


def _time_out_children(now: datetime) -> int:
    count = 0
    for child_id in _LIVE_SYNC_CHILDREN.overdue(now):
        with transaction.atomic():
            child = Run.objects.get(pk=child_id)
            if child.parent_run_id is None:
                continue
            parent = lock_run(child.parent_run_id, light=True)
            # Told first, so that the child's own end (cancelled) changes nothing more.
            updated = Run.objects.filter(pk=child_id, parent_notified_at__isnull=True).update(
                parent_notified_at=now
            )
            if not updated:
                continue
            message = f"the step timed out waiting for child run {child_id}"
            run_cancel(run_id=child_id, reason=message, actor="engine")
            record(
                child.parent_step_id or 0,
                parent.pk,
                child.parent_step_attempt or 0,
                Outcome(error=ToolError("timeout", message)),
            )
            count += 1
    return count


__all__ = [
    "CallbackNotFound",
    "CallbackRefused",
    "Opening",
    "Reading",
    "new_callback",
    "open_callback",
    "poll_defer",
    "poll_due",
    "receive_callback",
    "record_reading",
    "sweep",
]
