"""Writes for organizations, API keys and the credit ledger."""

from __future__ import annotations

import hashlib
import secrets
import uuid
from datetime import timedelta
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from uuid import UUID

from django.db import connection, transaction
from django.utils import timezone

from billing.models import (
    ApiKey,
    ApiKeyScope,
    EntryType,
    LedgerEntry,
    Organization,
    Reservation,
)
from common.queries import fetch, instances, named

API_KEY_PREFIX = "ork"
CREDIT_QUANTUM = Decimal("0.000001")
# last_used_at is a hint for operators, not an audit log: write it at most this often.
LAST_USED_RESOLUTION = timedelta(minutes=1)
QUERIES = named(Path(__file__).parent / "queries")


def hash_api_key(raw_key: str) -> str:
    return hashlib.sha256(raw_key.encode()).hexdigest()


@transaction.atomic
def organization_create(*, name: str) -> Organization:
    name = name.strip()
    if not name:
        raise ValueError("organization name must not be empty")
    return Organization.objects.create(name=name)


@transaction.atomic
def api_key_create(
    *, organization: Organization, name: str = "default", scope: str = ApiKeyScope.FULL
) -> tuple[ApiKey, str]:
    """Create a key; return it with the raw secret, which is never stored or shown again."""
    if scope not in ApiKeyScope.values:
        raise ValueError(f"unknown scope {scope!r}; use {', '.join(ApiKeyScope.values)}")
    prefix = secrets.token_hex(4)
    raw_key = f"{API_KEY_PREFIX}_{prefix}_{secrets.token_urlsafe(32)}"
    api_key = ApiKey.objects.create(
        organization=organization,
        name=name.strip() or "default",
        prefix=prefix,
        key_hash=hash_api_key(raw_key),
        scope=scope,
    )
    return api_key, raw_key


@transaction.atomic
def api_key_revoke(*, api_key: ApiKey) -> ApiKey:
    locked = ApiKey.objects.select_for_update().get(pk=api_key.pk)
    if locked.revoked_at is None:
        locked.revoked_at = timezone.now()
        locked.save(update_fields=["revoked_at"])
    return locked


def api_key_authenticate(raw_key: str) -> ApiKey | None:
    """The active key matching ``raw_key``, or None (unknown, malformed or revoked)."""
    parts = raw_key.split("_", 2)
    if len(parts) != 3 or parts[0] != API_KEY_PREFIX or len(raw_key) > 200:
        return None
    names, rows = fetch(QUERIES["api_key_authenticate"], {"hash": hash_api_key(raw_key)})
    if not rows:
        return None
    # The key's columns, then the organization's (no ORM: every request pays this).
    cut = names.index("|")
    api_key = instances(ApiKey, names[:cut], [rows[0][:cut]])[0]
    api_key.organization = instances(Organization, names[cut + 1 :], [rows[0][cut + 1 :]])[0]
    now = timezone.now()
    if api_key.last_used_at is None or now - api_key.last_used_at > LAST_USED_RESOLUTION:
        ApiKey.objects.filter(pk=api_key.pk).update(last_used_at=now)
        api_key.last_used_at = now
    return api_key


# --------------------------------------------------------------------------- credits
#
# Lock order, as everywhere: run -> agent -> task -> step -> attempt -> organization.
# The organization row is the account: every entry locks it (FOR NO KEY UPDATE), so two
# reservations can never both see the same available balance, whatever the connection.


class InsufficientCredits(Exception):
    """The organization cannot cover a reservation. API: 402 `insufficient_credits`."""

    code = "insufficient_credits"

    def __init__(self, needed: Decimal, available: Decimal) -> None:
        self.needed = needed
        self.available = available
        super().__init__(f"needs {needed} credits, {available} available")


class BudgetExhausted(Exception):
    """A charge beyond the attempt's reservation (the step fails, not retryable)."""

    code = "budget_exhausted"

    def __init__(self, amount: Decimal, remaining: Decimal) -> None:
        self.amount = amount
        self.remaining = remaining
        super().__init__(f"charge of {amount} exceeds the {remaining} credits left reserved")


def to_credits(value: Decimal | int | str) -> Decimal:
    amount = Decimal(str(value)).quantize(CREDIT_QUANTUM, rounding=ROUND_HALF_UP)
    if not amount.is_finite():
        raise ValueError(f"not a finite amount: {value!r}")
    return amount


def _existing(organization_id: UUID, key: str) -> LedgerEntry | None:
    return LedgerEntry.objects.filter(organization_id=organization_id, idempotency_key=key).first()


def _lock_org(organization_id: UUID) -> Organization:
    return Organization.objects.select_for_update(no_key=True).get(pk=organization_id)


@transaction.atomic
def credits_grant(
    *,
    organization: Organization,
    amount: Decimal | int | str,
    reason: str,
    idempotency_key: str | None = None,
    actor: str = "system",
) -> LedgerEntry:
    """Add credits. A repeated call with the same key returns the first entry."""
    amount = to_credits(amount)
    if amount <= 0:
        raise ValueError("a grant must be positive")
    key = f"grant:{idempotency_key or uuid.uuid4()}"
    org = _lock_org(organization.pk)
    existing = _existing(org.pk, key)
    if existing:
        return existing
    entry = LedgerEntry.objects.create(
        organization=org,
        type=EntryType.GRANT,
        amount=amount,
        idempotency_key=key,
        reason=reason.strip()[:500],
        actor=actor,
    )
    org.credits_available += amount
    org.save(update_fields=["credits_available"])
    return entry


# The organization's credits move by the database's functions (billing/sql/credits_*.sql:
# reserve, charge, settle), which the engine's recordings call too: each rule once.


def credits_reserve(
    *,
    organization_id: UUID,
    run_id: UUID,
    attempt_id: int,
    attempt_number: int,
    amount: Decimal | int | str,
    actor: str = "system",
) -> UUID:
    """Hold ``amount`` for a run attempt (``billing.credits_reserve``) and return its
    ledger entry's id; raise InsufficientCredits if it is not available. Keyed by the
    attempt: a retried call returns the first reservation."""
    amount = to_credits(amount)
    if amount <= 0:
        raise ValueError("a reservation must be positive")
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT billing.credits_reserve(%s, %s, %s, %s::smallint, %s, %s)",
            [organization_id, run_id, attempt_id, attempt_number, amount, actor],
        )
        entry_id = cursor.fetchone()[0]
    if entry_id is None:
        available = Organization.objects.values_list("credits_available", flat=True).get(
            pk=organization_id
        )
        raise InsufficientCredits(amount, available)
    return UUID(str(entry_id))


@transaction.atomic
def credits_reserve_more(
    *,
    organization_id: UUID,
    run_id: UUID,
    attempt_number: int,
    amount: Decimal | int | str,
    key: str,
    reason: str = "",
    actor: str = "system",
) -> LedgerEntry:
    """Hold ``amount`` more for a run attempt already reserved (a re-plan's new agents);
    raise InsufficientCredits if it is not available. Keyed by ``key`` (under the
    attempt's): a retried call returns the first entry. Settling refunds it with the rest."""
    amount = to_credits(amount)
    if amount <= 0:
        raise ValueError("a reservation must be positive")
    org = _lock_org(organization_id)
    reservation = (
        Reservation.objects.select_for_update(no_key=True)
        .filter(run_id=run_id, attempt_number=attempt_number)
        .first()
    )
    if reservation is None or reservation.settled_at is not None:
        raise ValueError(f"run {run_id} attempt {attempt_number} has no open reservation")
    key = f"reserve:{reservation.attempt_id}:{key}"
    existing = _existing(org.pk, key)
    if existing:
        return existing
    if org.credits_available < amount:
        raise InsufficientCredits(amount, org.credits_available)
    entry = LedgerEntry.objects.create(
        organization=org,
        run_id=run_id,
        attempt_id=reservation.attempt_id,
        type=EntryType.RESERVE,
        amount=amount,
        idempotency_key=key,
        reason=(reason or reserve_reason(run_id, attempt_number))[:500],
        actor=actor,
    )
    org.credits_available -= amount
    org.save(update_fields=["credits_available"])
    reservation.reserved += amount
    reservation.save(update_fields=["reserved"])
    return entry


def reserve_reason(run_id: UUID, attempt_number: int) -> str:
    """The reason a reservation's ledger entry gives (billing.credits_reserve writes it so)."""
    return f"run {run_id} attempt {attempt_number}"


def credits_charge(*, run_id: UUID, attempt_number: int, amount: Decimal | int | str) -> Decimal:
    """Draw one step attempt's cost on the run attempt's reservation
    (``billing.credits_charge``): its counter, not the ledger, which receives the attempt's
    charges as one entry when it settles. Returns the amount drawn; a zero cost draws
    nothing. Beyond the reservation (or after settlement): BudgetExhausted, nothing drawn.

    Not keyed: the caller charges a step attempt once, in the transaction that moves it
    out of RUNNING, holding the step's row found by its status and attempt number (a
    duplicate finds it recorded and charges nothing; docs/engine.md, "Billing")."""
    amount = to_credits(amount)
    if amount < 0:
        raise ValueError("a charge cannot be negative")
    if amount == 0:
        return amount
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT billing.credits_charge(%s, %s::smallint, %s)", [run_id, attempt_number, amount]
        )
        drawn = cursor.fetchone()[0]
    if not drawn:
        reservation = Reservation.objects.filter(
            run_id=run_id, attempt_number=attempt_number
        ).first()
        raise BudgetExhausted(amount, Decimal(0) if reservation is None else reservation.held)
    return amount


def credits_settle(
    *, run_id: UUID, attempt_number: int, actor: str = "system"
) -> LedgerEntry | None:
    """On a terminal state (``billing.credits_settle``): the attempt's charges entered in the
    ledger as one entry, and whatever is reserved and not charged refunded; the refund's
    entry, or None when nothing remained. Idempotent: settled already, the first refund's
    entry."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT billing.credits_settle(%s, %s::smallint, %s)", [run_id, attempt_number, actor]
        )
        refunded = cursor.fetchone()[0]
    reservation = Reservation.objects.filter(run_id=run_id, attempt_number=attempt_number).first()
    if refunded == 0 or reservation is None:
        return None
    return _existing(reservation.organization_id, f"refund:{reservation.attempt_id}")
