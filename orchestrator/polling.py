"""A poll step's readings (docs/runners.md, "Polls"): one message per reading, sent by
the engine with the poll's interval as countdown (``runs.waits.callbacks.record_reading``), so
no worker is held between readings.

A reading is a GET through ``orchestrator.outbound``, like the http tool's requests:
the address guard, one deadline for the whole exchange, at most POLL_BODY_LIMIT bytes
of the decoded body read. Any answer is a response the conditions read
(``${response.status}``, ``${response.body}``, ``${response.headers}``); no answer at
all (refused, timed out, undecodable) is one too, with ``${response.error}`` set and no
status. A condition that cannot be evaluated on a response (a field the body does not
have yet) does not hold.

A reading is work the organization has a worker do, as a step is: it is made in one of
the organization's step slots (``runs.admission.fairness``), and put off, uncounted, while they
are all held, or while the organization is suspended (no request leaves for it then).
"""

from __future__ import annotations

import json
import logging
import os
import time
from typing import Any

import httpx
from django.conf import settings
from django.db import DatabaseError
from django.utils import timezone

from common.expressions import ExpressionError, parsed
from common.task_base import TRANSIENT
from common.templates import Reference, TemplateError, UnresolvedReference, resolve_in
from common.text import storable_text, unstorable_string
from orchestrator import outbound
from orchestrator.lease_keeper import slot_held
from orchestrator.netguard import POLL, AddressNotAllowed
from runs.outbox import schedule_poll
from runs.waits.callbacks import POLL_BODY_LIMIT, Reading, poll_defer, poll_due, record_reading

logger = logging.getLogger(__name__)
# The longest one reading may take in all, whatever the interval (and never past the
# poll's own timeout).
READ_TIMEOUT_S = 30.0
# A reading that comes this much before its time or less is made: a countdown's own
# precision. Earlier, it is a link of a long interval's chain (``schedule_poll``).
EARLY_SLACK_S = 1.0
# A reading that finds its organization's step slots all held tries again this much
# later (or after its interval, if shorter).
NO_SLOT_DELAY_S = 1.0


def poll_once(wait_id: str, number: int) -> bool:
    """Make reading ``number`` of poll ``wait_id`` if it is the one due, and record it."""
    wait = poll_due(wait_id, number)
    if wait is None:
        return False  # a duplicate or late message, or the poll ended
    now = timezone.now()
    early_s = (wait.next_poll_at - now).total_seconds() if wait.next_poll_at else 0
    if early_s > EARLY_SLACK_S:
        # A message of a long interval, sent at most RATE_LIMIT_MAX_COUNTDOWN_S ahead.
        schedule_poll(wait_id, number, early_s)
        return False
    params = wait.params
    interval = float(params["interval"])
    organization = wait.run.organization
    if organization.suspended_at is not None:
        # Looked at again after an interval, as a reading would be: the same messages,
        # no request, until the suspension is lifted.
        poll_defer(wait_id, number, interval)
        return False
    seconds = min(
        READ_TIMEOUT_S,
        float(settings.ENGINE_DEFAULT_STEP_TIMEOUT),
        (wait.expires_at - now).total_seconds(),
    )
    holder = f"poll:{os.uname().nodename}:{os.getpid()}:{wait_id}"
    with slot_held(organization.pk, holder) as slot:
        if slot is None:
            poll_defer(wait_id, number, min(interval, NO_SLOT_DELAY_S))
            return False
        response = fetch(
            params["url"], params.get("headers") or {}, params.get("query") or {}, seconds
        )
    return _record(wait_id, number, params, response)


def _record(wait_id: str, number: int, params: dict[str, Any], response: dict[str, Any]) -> bool:
    try:
        return record_reading(wait_id, number, Reading(response, verdict(params, response)))
    except TRANSIENT:
        raise  # retried by the task (common.task_base)
    except DatabaseError as exc:
        # Whatever PostgreSQL refused of a response still counts as a reading, one with
        # no answer: raised at every reading, it would hold the step until the sweep
        # found its wait expired, its readings and max_attempts never counted.
        logger.warning("reading %s of poll %s not stored: %s", number, wait_id, exc)
        failed = {"error": f"the response could not be stored ({type(exc).__name__})"}
        return record_reading(wait_id, number, Reading(failed, verdict(params, failed)))


def verdict(params: dict[str, Any], response: dict[str, Any]) -> str:
    """What the poll's conditions make of ``response``: "failed", "done" or ""."""
    if holds(params.get("failed_when") or "", response):
        return "failed"
    if holds(params["done_when"], response):
        return "done"
    return ""


def fetch(
    url: str, headers: dict[str, Any], query: dict[str, Any], seconds: float
) -> dict[str, Any]:
    """One GET within ``seconds`` in all: ``{status, headers, body}``, or ``{error}`` when
    nothing (whole) answered. Every string in it can be stored: NUL characters and
    unpaired surrogates of the answer's text are replaced by U+FFFD, and a JSON body
    holding one (an escaped ``\\u0000``) is kept as its text."""
    try:
        with outbound.exchange(
            "GET",
            url,
            deadline=time.monotonic() + seconds,
            refused=POLL,
            headers=headers,
            params=query or None,
        ) as answer:
            data = outbound.read(answer, POLL_BODY_LIMIT, cut=True)
    except AddressNotAllowed as exc:
        return {"error": f"address not allowed: {exc}"}
    except httpx.TimeoutException:
        return {"error": f"timeout: no whole answer within {seconds:g}s"}
    except (httpx.HTTPError, outbound.Undecodable, ValueError, TypeError) as exc:
        return {"error": storable_text(f"{type(exc).__name__}: {exc}")}
    text = storable_text(outbound.text(answer, data))
    body: Any = text or None
    if "json" in answer.headers.get("content-type", ""):
        body = _json_or(text, outbound.text(answer, data))
    return {
        "status": answer.status_code,
        "headers": {storable_text(k): storable_text(v) for k, v in answer.headers.items()},
        "body": body,
    }


def _json_or(text: str, raw: str) -> Any:
    """``raw`` parsed, if it is JSON PostgreSQL can store within POLL_BODY_LIMIT;
    otherwise ``text``."""
    try:
        body = json.loads(raw, parse_constant=_not_json)
        stored = json.dumps(body, allow_nan=False)  # 1e999 parses as inf
    except (ValueError, RecursionError):
        return text
    if len(stored) > POLL_BODY_LIMIT or unstorable_string(body) is not None:
        return text
    return body


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def holds(condition: str, response: dict[str, Any]) -> bool:
    if not condition:
        return False

    def resolve(ref: Reference) -> Any:
        if ref[0] != "response":
            raise UnresolvedReference("a poll condition reads only response", ref)
        return resolve_in(response, ref[1:])

    try:
        return parsed(condition).truthy(resolve)
    except (ExpressionError, TemplateError, UnresolvedReference) as exc:
        logger.debug("poll condition %r does not hold: %s", condition, exc)
        return False
