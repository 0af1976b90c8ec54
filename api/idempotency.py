"""`Idempotency-Key` on every POST: one side effect per key, whatever the retries.

A key is scoped to (organization, method, path) and kept ``IDEMPOTENCY_TTL_HOURS``.

1. **Claim.** The request inserts an ``in_progress`` IdempotencyRecord in one statement
   of its own, committed, taking over the key's row in place if it has expired; the
   unique constraint decides, across every web process, which of several concurrent
   requests owns the key. A loser reads the row it collided with:
   ``in_progress`` -> 409 ``idempotency_key_in_use``; completed with another body ->
   422 ``idempotency_key_reused``; completed with the same body -> the stored response,
   replayed (a 201 as 200) with ``Idempotent-Replayed: true`` and no side effect. A body
   is known by its fingerprint, an HMAC keyed by the server's key (``fingerprint``).
2. **Run.** The view runs in one transaction. A success is stored in the *same*
   transaction, by an UPDATE that only succeeds while this request still owns its claim:
   the side effects and the stored response commit together or not at all.
3. **Errors are not stored.** A 4xx or 5xx (raised or returned) rolls the view back and
   deletes the claim, so the client may fix the problem (add credits, correct the plan)
   and retry with the same key. None of our errors leaves a side effect to protect.

A response field that holds a secret (a webhook endpoint's signing secret, shown once)
is stored sealed, never in clear: encrypted with ``SECRETS_ENCRYPTION_KEYS`` as
``{"sealed": "<Fernet token>"}``, and opened again for the replay, which answers it as
the first answer did (``idempotent_sealing("secret")``).

A claim that is never completed (its process was killed mid-request; the transaction
rolled back with it) stops counting after ``IN_PROGRESS_LEASE``, like any expired row. If
its owner was merely slow and the key was claimed again meanwhile, the owner's
completing UPDATE matches nothing and it rolls back, so the effect still happens once.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

from cryptography.fernet import InvalidToken
from django.conf import settings
from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter
from rest_framework.exceptions import APIException
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response

from api.authentication import organization_of
from api.models import IdempotencyRecord, IdempotencyStatus
from billing.models import Organization
from billing.secrets import decrypt_value, encrypt_value
from common.digests import canonical_json, keyed_digest
from common.queries import fetch, named

logger = logging.getLogger(__name__)

HEADER = "Idempotency-Key"
REPLAYED_HEADER = "Idempotent-Replayed"
MAX_KEY_LENGTH = 255
# Longer than any request may take (gunicorn kills a worker after 30 s), and no longer:
# a client whose request died with its web process (or lost the database mid-request)
# gets 409 idempotency_key_in_use, with Retry-After, only until the lease runs out.
IN_PROGRESS_LEASE = timedelta(seconds=60)
CLAIM_ATTEMPTS = 5
QUERIES = named(Path(__file__).parent / "queries")
SEALED = "sealed"  # a stored field's form when encrypted: {"sealed": "<Fernet token>"}
# What the key of body fingerprints is derived from SECRET_KEY for (salted_hmac's salt).
FINGERPRINT_PURPOSE = "api.idempotency.fingerprint"

IDEMPOTENCY_PARAMETER = OpenApiParameter(
    name=HEADER,
    type={"type": "string", "minLength": 1, "maxLength": MAX_KEY_LENGTH, "pattern": "^[ -~]+$"},
    location=OpenApiParameter.HEADER,
    required=False,
    description=(
        "Makes the request safe to retry: at most 255 printable ASCII characters, scoped to "
        "your organization, the method and the path, kept 24 h. A retry with the same key "
        "and body replays the first response (a 201 as 200) with `Idempotent-Replayed: true`."
    ),
)
REPLAYED_PARAMETER = OpenApiParameter(
    name=REPLAYED_HEADER,
    type={"type": "string", "enum": ["true"]},
    location=OpenApiParameter.HEADER,
    response=[200],
    description="Present on a response replayed for a repeated Idempotency-Key.",
)


class InvalidIdempotencyKey(APIException):
    status_code = 400
    default_code = "invalid_idempotency_key"
    default_detail = f"{HEADER} must be 1 to {MAX_KEY_LENGTH} printable ASCII characters"


class IdempotencyKeyInUse(APIException):
    status_code = 409
    default_code = "idempotency_key_in_use"
    retry_after = 1  # seconds; sent as Retry-After (api.errors)
    default_detail = (
        f"a request with this {HEADER} is still being processed; retry once it has finished"
    )


class IdempotencyKeyReused(APIException):
    status_code = 422
    default_code = "idempotency_key_reused"
    default_detail = f"this {HEADER} was already used with a different request body"


@dataclass(frozen=True)
class Scope:
    organization: Organization
    method: str
    path: str
    key: str

    def records(self) -> QuerySet[IdempotencyRecord]:
        return IdempotencyRecord.objects.filter(
            organization=self.organization, method=self.method, path=self.path, key=self.key
        )


@dataclass(frozen=True)
class Claim:
    """This request owns the key: ``record_id`` is its in_progress row, claimed at
    ``claimed_at`` (the row's ``created_at``: a claim taken over later has another)."""

    record_id: int
    claimed_at: datetime

    def records(self) -> QuerySet[IdempotencyRecord]:
        """This claim's row, while it is still this claim's and in progress."""
        return IdempotencyRecord.objects.filter(
            pk=self.record_id, created_at=self.claimed_at, status=IdempotencyStatus.IN_PROGRESS
        )


def validate_key(raw: str) -> str:
    if not 0 < len(raw) <= MAX_KEY_LENGTH or not all(" " <= char <= "~" for char in raw):
        raise InvalidIdempotencyKey()
    return raw


def fingerprint(data: Any, secret: str | bytes | None = None) -> str:
    """The body's keyed digest (``common.digests``) under ``SECRET_KEY`` (or ``secret``).
    Keyed because a body may hold a secret (a webhook create's signing secret) and its
    fingerprint is stored: a bare hash would let anyone who reads the row confirm a
    guess of that secret offline."""
    return keyed_digest(FINGERPRINT_PURPOSE, data, secret)


def fingerprint_earlier(data: Any, stored: str) -> bool:
    """Whether ``stored``, a record's fingerprint that is not ``fingerprint(data)``, is
    still ``data``'s, stored within the record's life under a key no longer the first:
    a key of ``SECRET_KEY_FALLBACKS`` (a rotation), or none (records stored before
    fingerprints were keyed held the bare SHA-256; they are all gone
    ``IDEMPOTENCY_TTL_HOURS`` after the upgrade, and this form with them). Without it,
    a client's retry across the change would be refused 422 ``idempotency_key_reused``."""
    forms = [fingerprint(data, secret) for secret in settings.SECRET_KEY_FALLBACKS]
    forms.append(hashlib.sha256(canonical_json(data)).hexdigest())
    return any(hmac.compare_digest(stored, form) for form in forms)


def idempotency_claim(
    *,
    scope: Scope,
    fingerprint: str,
    earlier: Callable[[str], bool] | None = None,
    now: datetime | None = None,
) -> Claim | IdempotencyRecord:
    """Claim the key, or return the completed record to replay; or raise 409 / 422. The
    claim is one statement (api/queries/idempotency_claim.sql, which takes over an
    expired row in place); only a collision reads the row it collided with. A record
    whose fingerprint is not ``fingerprint`` is of the same body when ``earlier`` says
    so (``fingerprint_earlier``)."""
    for _ in range(CLAIM_ATTEMPTS):
        now = now or timezone.now()
        params = {
            "organization": scope.organization.pk,
            "method": scope.method,
            "path": scope.path,
            "key": scope.key,
            "fingerprint": fingerprint,
            "now": now,
            "lease": now + IN_PROGRESS_LEASE,
        }
        _, rows = fetch(QUERIES["idempotency_claim"], params)
        if rows:
            return Claim(rows[0][0], now)
        existing = scope.records().filter(expires_at__gt=now).first()
        if existing is None:
            continue  # released or expired since the collision: claim again
        if existing.status == IdempotencyStatus.IN_PROGRESS:
            raise IdempotencyKeyInUse()
        same = hmac.compare_digest(existing.fingerprint, fingerprint)
        if not (same or (earlier is not None and earlier(existing.fingerprint))):
            raise IdempotencyKeyReused()
        return existing
    raise IdempotencyKeyInUse()


def idempotency_complete(
    *, claim: Claim, response_status: int, response_body: Any, now: datetime | None = None
) -> bool:
    """Store the response; False if the claim was lost (expired and taken over)."""
    now = now or timezone.now()
    stored = claim.records().update(
        status=IdempotencyStatus.COMPLETED,
        response_status=response_status,
        response_body=response_body,
        expires_at=now + timedelta(hours=settings.IDEMPOTENCY_TTL_HOURS),
    )
    return stored == 1


def idempotency_release(*, claim: Claim) -> None:
    claim.records().delete()


def idempotency_records_expire(*, now: datetime | None = None, batch: int = 1000) -> int:
    """Delete expired records, ``batch`` rows per statement; return how many. Idempotent:
    two sweeps at once delete each row once, a late one finds nothing."""
    now = now or timezone.now()
    deleted = 0
    while True:
        ids = list(
            IdempotencyRecord.objects.filter(expires_at__lte=now).values_list("pk", flat=True)[
                :batch
            ]
        )
        if not ids:
            return deleted
        count, _ = IdempotencyRecord.objects.filter(pk__in=ids, expires_at__lte=now).delete()
        deleted += count
        if len(ids) < batch:
            return deleted


def replay(record: IdempotencyRecord, sealed: Sequence[str] = ()) -> Response:
    status = 200 if record.response_status == 201 else int(record.response_status or 200)
    body = unseal(record.response_body, sealed)
    return Response(body, status=status, headers={REPLAYED_HEADER: "true"})


def seal(body: Any, fields: Sequence[str]) -> Any:
    """``body`` with each of ``fields`` (top-level strings) encrypted: what is stored."""
    if not fields or not isinstance(body, dict):
        return body
    return {
        name: {SEALED: encrypt_value(value).decode("ascii")}
        if name in fields and isinstance(value, str)
        else value
        for name, value in body.items()
    }


def unseal(body: Any, fields: Sequence[str]) -> Any:
    """``body`` as it was answered: each sealed field of ``fields`` decrypted. One that
    no key of SECRETS_ENCRYPTION_KEYS opens (the key was removed within the record's
    life) is answered null, and logged; never the sealed text."""
    if not fields or not isinstance(body, dict):
        return body
    opened = dict(body)
    for name in fields:
        value = body.get(name)
        if isinstance(value, dict) and isinstance(value.get(SEALED), str):
            try:
                opened[name] = decrypt_value(value[SEALED].encode("ascii"))
            except InvalidToken:
                logger.warning("a replayed response's %s cannot be decrypted: answered null", name)
                opened[name] = None
    return opened


def _storable(data: Any) -> Any:
    """The response data exactly as the client received it, as plain JSON values."""
    return json.loads(JSONRenderer().render(data))


Handler = TypeVar("Handler", bound=Callable[..., Response])


def idempotent(handler: Handler) -> Handler:
    """Decorate a view's ``post``: honour ``Idempotency-Key`` as described above."""
    return _idempotent(handler, ())


def idempotent_sealing(*sealed: str) -> Callable[[Handler], Handler]:
    """``idempotent``, storing the response's ``sealed`` fields encrypted (module doc)."""

    def decorate(handler: Handler) -> Handler:
        return _idempotent(handler, sealed)

    return decorate


def _idempotent(handler: Handler, sealed: Sequence[str]) -> Handler:
    @functools.wraps(handler)
    def wrapper(view: Any, request: Request, *args: Any, **kwargs: Any) -> Response:
        raw_key = request.headers.get(HEADER)
        if raw_key is None:
            return handler(view, request, *args, **kwargs)
        key = validate_key(raw_key)
        scope = Scope(organization_of(request), request.method or "POST", request.path, key)
        # Parsing happens here, before the claim: a malformed or oversized body is a
        # validation failure and stores nothing.
        outcome = idempotency_claim(
            scope=scope,
            fingerprint=fingerprint(request.data),
            earlier=functools.partial(fingerprint_earlier, request.data),
        )
        if isinstance(outcome, IdempotencyRecord):
            return replay(outcome, sealed)
        succeeded = False
        try:
            with transaction.atomic():
                response = handler(view, request, *args, **kwargs)
                succeeded = 200 <= response.status_code < 400
                if not succeeded:
                    transaction.set_rollback(True)
                elif not idempotency_complete(
                    claim=outcome,
                    response_status=response.status_code,
                    response_body=seal(_storable(response.data), sealed),
                ):
                    raise IdempotencyKeyInUse()
        finally:
            if not succeeded:
                idempotency_release(claim=outcome)
        return response

    return wrapper  # type: ignore[return-value]
