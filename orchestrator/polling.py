"""A poll step's readings (docs/runners.md, "Polls"): one message per reading, sent by
the engine with the poll's interval as countdown (``runs.callbacks.record_reading``), so
no worker is held between readings.

A reading is a GET through the address guard, like the http tool's requests. Any
answer is a response the conditions read (``${response.status}``, ``${response.body}``,
``${response.headers}``); no answer at all (refused, timed out) is one too, with
``${response.error}`` set and no status. A condition that cannot be evaluated on a
response (a field the body does not have yet) does not hold.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import httpx
from django.conf import settings
from django.utils import timezone

from common.expressions import ExpressionError, parsed
from common.templates import Reference, TemplateError, UnresolvedReference, resolve_in
from orchestrator.netguard import POLL, AddressNotAllowed, guarded_client
from runs.callbacks import POLL_BODY_LIMIT, Reading, poll_due, record_reading
from runs.outbox import schedule_poll

logger = logging.getLogger(__name__)
# The longest one reading may take, whatever the interval.
READ_TIMEOUT_S = 30.0
# A reading that comes this much before its time or less is made: a countdown's own
# precision. Earlier, it is a link of a long interval's chain (``schedule_poll``).
EARLY_SLACK_S = 1.0


def poll_once(wait_id: str, number: int) -> bool:
    """Make reading ``number`` of poll ``wait_id`` if it is the one due, and record it."""
    wait = poll_due(wait_id, number)
    if wait is None:
        return False  # a duplicate or late message, or the poll ended
    early_s = (wait.next_poll_at - timezone.now()).total_seconds() if wait.next_poll_at else 0
    if early_s > EARLY_SLACK_S:
        # A message of a long interval, sent at most RATE_LIMIT_MAX_COUNTDOWN_S ahead.
        schedule_poll(wait_id, number, early_s)
        return False
    params = wait.params
    response = fetch(params["url"], params.get("headers") or {}, params.get("query") or {})
    verdict = ""
    if holds(params.get("failed_when") or "", response):
        verdict = "failed"
    elif holds(params["done_when"], response):
        verdict = "done"
    return record_reading(wait_id, number, Reading(response, verdict))


def fetch(url: str, headers: dict[str, Any], query: dict[str, Any]) -> dict[str, Any]:
    """One GET: ``{status, headers, body}``, or ``{error}`` when nothing answered."""
    timeout = min(READ_TIMEOUT_S, float(settings.ENGINE_DEFAULT_STEP_TIMEOUT))
    try:
        with guarded_client(
            settings.HTTP_TOOL_ALLOWED_NETWORKS, refused=POLL, timeout=timeout
        ) as client:
            answer = client.get(url, headers=headers, params=query or None)
    except AddressNotAllowed as exc:
        return {"error": f"address not allowed: {exc}"}
    except (httpx.HTTPError, ValueError, TypeError) as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    text = answer.text[:POLL_BODY_LIMIT]
    body: Any = text or None
    if "json" in answer.headers.get("content-type", ""):
        try:
            body = json.loads(answer.text)
        except ValueError:
            body = text
    if len(json.dumps(body, default=str)) > POLL_BODY_LIMIT:
        body = text
    return {"status": answer.status_code, "headers": dict(answer.headers), "body": body}


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
