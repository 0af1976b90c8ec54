"""Writes for organizations, API keys and the credit ledger."""

from __future__ import annotations

import hashlib
import secrets
import uuid
from datetime import timedelta
from decimal import ROUND_HALF_UP, Decimal
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

API_KEY_PREFIX = "ork"
CREDIT_QUANTUM = Decimal("0.000001")
# last_used_at is a hint for operators, not an audit log: write it at most this often.
LAST_USED_RESOLUTION = timedelta(minutes=1)


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
    api_key = (
        ApiKey.objects.select_related("organization")
        .filter(key_hash=hash_api_key(raw_key), revoked_at__isnull=True)
        .first()
    )
    if api_key is None:
        return None
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


@transaction.atomic
def credits_reserve(
    *,
    organization_id: UUID,
    run_id: UUID,
    attempt_id: int,
    attempt_number: int,
    amount: Decimal | int | str,
    actor: str = "system",
) -> LedgerEntry:
    """Hold ``amount`` for a run attempt; raise InsufficientCredits if it is not available.

    Keyed by the attempt: a retried call returns the first reservation.
    """
    amount = to_credits(amount)
    if amount <= 0:
        raise ValueError("a reservation must be positive")
    key = f"reserve:{attempt_id}"
    org = _lock_org(organization_id)  # serialises every movement of this organization
    existing = _existing(org.pk, key)
    if existing:
        return existing
    if org.credits_available < amount:
        raise InsufficientCredits(amount, org.credits_available)
    entry = LedgerEntry.objects.create(
        organization=org,
        run_id=run_id,
        attempt_id=attempt_id,
        type=EntryType.RESERVE,
        amount=amount,
        idempotency_key=key,
        reason=reserve_reason(run_id, attempt_number),
        actor=actor,
    )
    org.credits_available -= amount
    org.save(update_fields=["credits_available"])
    Reservation.objects.create(
        organization=org,
        run_id=run_id,
        attempt_number=attempt_number,
        attempt_id=attempt_id,
        reserved=amount,
    )
    return entry


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


# One statement: the attempt's budget is checked and drawn on, and the entry written, in a
# single round trip (this runs once per step attempt). The NOT EXISTS keeps a replay from
# drawing twice; two concurrent replays serialise on the reservation row and the second
# then fails on the unique key, rolling its transaction back.
_CHARGE_SQL = """
WITH drawn AS (
    UPDATE billing_reservation SET charged = charged + %(amount)s
    WHERE run_id = %(run)s AND attempt_number = %(number)s
      AND settled_at IS NULL
      AND reserved - charged - refunded >= %(amount)s
      AND NOT EXISTS (
          SELECT 1 FROM billing_ledgerentry
          WHERE organization_id = %(organization)s AND idempotency_key = %(key)s
      )
    RETURNING attempt_id, run_id
)
INSERT INTO billing_ledgerentry
    (id, organization_id, run_id, attempt_id, step_id, type, amount, idempotency_key,
     reason, actor, created_at)
SELECT %(id)s, %(organization)s, drawn.run_id, drawn.attempt_id, %(step)s, 'charge',
       %(amount)s, %(key)s, %(reason)s, %(actor)s, now()
FROM drawn
RETURNING id, attempt_id
"""


# The same charge as a part of a larger statement (the engine's hot path records a step
# and charges it in one round trip): billing keeps the SQL of its own tables. The
# statement that includes these CTEs defines one named ``charge`` with the columns
# (id, organization_id, run_id, attempt_number, step_id, amount, key, reason, actor), one
# row when a charge is due and none otherwise; ``charge_drawn`` then returns a row only
# if the reservation could pay it, so the statement can make everything else depend on
# it. An amount must be positive and already rounded (``to_credits``).
CHARGE_CTES = """
charge_drawn AS (
    UPDATE billing_reservation AS r SET charged = r.charged + charge.amount
    FROM charge
    WHERE r.run_id = charge.run_id AND r.attempt_number = charge.attempt_number
      AND r.settled_at IS NULL
      AND r.reserved - r.charged - r.refunded >= charge.amount
      AND NOT EXISTS (
          SELECT 1 FROM billing_ledgerentry AS l
          WHERE l.organization_id = charge.organization_id AND l.idempotency_key = charge.key
      )
    RETURNING r.attempt_id, r.run_id
), charge_entry AS (
    INSERT INTO billing_ledgerentry
        (id, organization_id, run_id, attempt_id, step_id, type, amount, idempotency_key,
         reason, actor, created_at)
    SELECT charge.id, charge.organization_id, drawn.run_id, drawn.attempt_id, charge.step_id,
           'charge', charge.amount, charge.key, charge.reason, charge.actor, now()
    FROM charge, charge_drawn AS drawn
)"""


# A reservation as a part of a larger statement (``runs.services.run_start`` opens an
# attempt and reserves its credits in one round trip), as credits_reserve() would write
# it. ``RESERVE_DRAWN`` draws on the organization (its row lock serialises every movement
# of its credits, as ``_lock_org`` does) only if enough is available, and returns a row
# only then, so the statement can make everything else depend on it. The statement then
# defines one named ``reserve`` with the columns (id, organization_id, run_id,
# attempt_id, attempt_number, amount, reason, actor), one row when ``reserve_drawn`` gave
# one, and adds ``RESERVE_WRITTEN``: the ledger entry and the reservation row. The
# amount must be positive and already rounded (``to_credits``).
RESERVE_DRAWN = """reserve_drawn AS (
    UPDATE billing_organization AS o
    SET credits_available = o.credits_available - %(reserve_amount)s
    WHERE o.id = %(reserve_organization)s AND o.credits_available >= %(reserve_amount)s
    RETURNING o.id
)"""
RESERVE_WRITTEN = """reserve_entry AS (
    INSERT INTO billing_ledgerentry
        (id, organization_id, run_id, attempt_id, step_id, type, amount, idempotency_key,
         reason, actor, created_at)
    SELECT reserve.id, reserve.organization_id, reserve.run_id, reserve.attempt_id, NULL,
           'reserve', reserve.amount, 'reserve:' || reserve.attempt_id::text, reserve.reason,
           reserve.actor, %(now)s
    FROM reserve
), reserve_held AS (
    INSERT INTO billing_reservation
        (organization_id, run_id, attempt_number, attempt_id, reserved, charged, refunded,
         settled_at, created_at)
    SELECT reserve.organization_id, reserve.run_id, reserve.attempt_number,
           reserve.attempt_id, reserve.amount, 0, 0, NULL, %(now)s
    FROM reserve
)"""


def reserve_reason(run_id: UUID, attempt_number: int) -> str:
    """The reason a reservation's ledger entry gives."""
    return f"run {run_id} attempt {attempt_number}"


# A step attempt's charge and its attempt's settlement together, as a part of a larger
# statement (the engine's hot path completes a run's last step, the run and its attempt
# in one round trip): what credits_charge() then credits_settle() would write. One
# statement cannot update the reservation row twice, so the charge is drawn and the rest
# refunded by one UPDATE. The statement defines ``charge`` as for CHARGE_CTES (zero or
# one row) and ``settle`` with the columns (run_id, attempt_number, reason, actor), one row
# when the attempt is to be settled; ``settle_drawn`` then returns a row only if the
# reservation was unsettled and could pay the charge, so the statement can make
# everything else depend on it; ``settle_entry`` returns the refund's amount when there
# was one. The reservation is read and updated under the run's lock (every writer of it
# holds that lock), so the amount read is the amount updated.
SETTLE_CTES = """
settle_held AS (
    SELECT r.id, r.attempt_id, r.organization_id, r.run_id,
           r.reserved - r.charged - r.refunded - COALESCE((SELECT amount FROM charge), 0)
               AS refund
    FROM billing_reservation AS r, settle
    WHERE r.run_id = settle.run_id AND r.attempt_number = settle.attempt_number
      AND r.settled_at IS NULL
      AND r.reserved - r.charged - r.refunded >= COALESCE((SELECT amount FROM charge), 0)
      AND NOT EXISTS (
          SELECT 1 FROM billing_ledgerentry AS l, charge
          WHERE l.organization_id = charge.organization_id AND l.idempotency_key = charge.key
      )
), settle_drawn AS (
    UPDATE billing_reservation AS r
    SET charged = r.charged + COALESCE((SELECT amount FROM charge), 0),
        refunded = r.refunded + held.refund,
        settled_at = now()
    FROM settle_held AS held
    WHERE r.id = held.id
    RETURNING r.id
), settle_charge_entry AS (
    INSERT INTO billing_ledgerentry
        (id, organization_id, run_id, attempt_id, step_id, type, amount, idempotency_key,
         reason, actor, created_at)
    SELECT charge.id, charge.organization_id, held.run_id, held.attempt_id, charge.step_id,
           'charge', charge.amount, charge.key, charge.reason, charge.actor, now()
    FROM charge, settle_held AS held
    WHERE EXISTS (SELECT 1 FROM settle_drawn)
), settle_entry AS (
    INSERT INTO billing_ledgerentry
        (id, organization_id, run_id, attempt_id, step_id, type, amount, idempotency_key,
         reason, actor, created_at)
    SELECT %(settle_id)s::uuid, held.organization_id, held.run_id, held.attempt_id, NULL,
           'refund', held.refund, 'refund:' || held.attempt_id::text, settle.reason,
           settle.actor, now()
    FROM settle_held AS held, settle
    WHERE held.refund > 0 AND EXISTS (SELECT 1 FROM settle_drawn)
    RETURNING amount
), settle_returned AS (
    UPDATE billing_organization AS o SET credits_available = o.credits_available + held.refund
    FROM settle_held AS held
    WHERE o.id = held.organization_id AND held.refund > 0
      AND EXISTS (SELECT 1 FROM settle_drawn)
)"""


def settle_reason(run_id: UUID, attempt_number: int) -> str:
    """The reason a settlement's refund entry gives."""
    return f"settled run {run_id} attempt {attempt_number}"


def charge_key(step_id: int, step_attempt: int) -> str:
    """The idempotency key of a step attempt's charge: one charge per attempt, ever."""
    return f"charge:{step_id}:{step_attempt}"


def credits_charge(
    *,
    organization_id: UUID,
    run_id: UUID,
    attempt_number: int,
    step_id: int,
    step_attempt: int,
    amount: Decimal | int | str,
    reason: str = "",
    actor: str = "system",
) -> LedgerEntry | None:
    """Charge one step attempt against the run attempt's reservation.

    Keyed by step and step attempt, so a duplicate delivery charges nothing more. A zero
    cost writes nothing. Beyond the reservation (or after settlement): BudgetExhausted,
    nothing written.
    """
    amount = to_credits(amount)
    if amount < 0:
        raise ValueError("a charge cannot be negative")
    if amount == 0:
        return None
    key = charge_key(step_id, step_attempt)
    with connection.cursor() as cursor:
        cursor.execute(
            _CHARGE_SQL,
            {
                "id": uuid.uuid4(),
                "organization": organization_id,
                "run": run_id,
                "number": attempt_number,
                "step": step_id,
                "amount": amount,
                "key": key,
                "reason": (reason or f"step {step_id} attempt {step_attempt}")[:500],
                "actor": actor,
            },
        )
        row = cursor.fetchone()
    if row is not None:
        return LedgerEntry(
            id=row[0],
            organization_id=organization_id,
            run_id=run_id,
            attempt_id=row[1],
            step_id=step_id,
            type=EntryType.CHARGE,
            amount=amount,
            idempotency_key=key,
            actor=actor,
        )
    existing = _existing(organization_id, key)
    if existing:
        return existing
    reservation = Reservation.objects.filter(run_id=run_id, attempt_number=attempt_number).first()
    raise BudgetExhausted(amount, Decimal(0) if reservation is None else reservation.held)


@transaction.atomic
def credits_settle(
    *, run_id: UUID, attempt_number: int, actor: str = "system"
) -> LedgerEntry | None:
    """On a terminal state: refund whatever is reserved and not charged. Idempotent; an
    attempt that reserved nothing has nothing to settle."""
    reservation = (
        Reservation.objects.select_for_update(no_key=True)
        .filter(run_id=run_id, attempt_number=attempt_number)
        .first()
    )
    if reservation is None:
        return None
    key = f"refund:{reservation.attempt_id}"
    if reservation.settled_at is not None:
        return _existing(reservation.organization_id, key)
    remaining = reservation.reserved - reservation.charged - reservation.refunded
    entry = None
    if remaining > 0:
        org = _lock_org(reservation.organization_id)
        entry = LedgerEntry.objects.create(
            organization=org,
            run_id=run_id,
            attempt_id=reservation.attempt_id,
            type=EntryType.REFUND,
            amount=remaining,
            idempotency_key=key,
            reason=settle_reason(run_id, attempt_number),
            actor=actor,
        )
        org.credits_available += remaining
        org.save(update_fields=["credits_available"])
        reservation.refunded += remaining
    reservation.settled_at = timezone.now()
    reservation.save(update_fields=["refunded", "settled_at"])
    return entry
