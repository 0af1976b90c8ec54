"""Reads of organizations, balances, the ledger and whether a key may still be used."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from django.db.models import F, Q, QuerySet, Sum
from django.db.models.functions import Coalesce

from billing.filters import LedgerFilter
from billing.models import ApiKey, LedgerEntry, Organization, Reservation
from common.filters import QueryData

ZERO = Decimal(0)


@dataclass(frozen=True)
class Balance:
    available: Decimal
    reserved: Decimal
    spent: Decimal

    @property
    def total(self) -> Decimal:
        return self.available + self.reserved


def organization_named(wanted: str) -> Organization | None:
    """The organization named ``wanted``, or with that id (what operators' commands
    accept), or None."""
    wanted = wanted.strip()
    found = Organization.objects.filter(name=wanted).first()
    if found is None:
        try:
            found = Organization.objects.filter(pk=uuid.UUID(wanted)).first()
        except ValueError:  # not an id either
            found = None
    return found


def organization_balance(organization: Organization) -> Balance:
    """Available is cached on the row; reserved and spent are summed over its
    reservations (one per run attempt): spent counts a running attempt's charges as its
    steps draw them, before its settlement enters them in the ledger."""
    held = Reservation.objects.filter(organization=organization).aggregate(
        reserved=Coalesce(
            Sum(F("reserved") - F("charged") - F("refunded"), filter=Q(settled_at__isnull=True)),
            ZERO,
        ),
        spent=Coalesce(Sum("charged"), ZERO),
    )
    return Balance(
        available=organization.credits_available, reserved=held["reserved"], spent=held["spent"]
    )


def ledger_for(
    organization: Organization, *, query: QueryData | None = None
) -> QuerySet[LedgerEntry]:
    """The organization's ledger, newest first, as ``query`` filters it (``LedgerFilter``)."""
    entries = LedgerEntry.objects.filter(organization=organization)
    return LedgerFilter(query or {}, queryset=entries).filtered().order_by("-created_at", "-id")


# Why a key may no longer be used (``key_refused``).
KEY_REVOKED = "the API key was revoked"
ORGANIZATION_SUSPENDED = "the organization is suspended"


def key_refused(api_key_id: Any) -> str:
    """Why the key may no longer be used, or "": ``KEY_REVOKED``,
    ``ORGANIZATION_SUSPENDED``. One read by primary keys: a live event stream asks at
    each heartbeat, a held runner poll at each look."""
    row = (
        ApiKey.objects.filter(pk=api_key_id)
        .values_list("revoked_at", "organization__suspended_at")
        .first()
    )
    if row is None or row[0] is not None:
        return KEY_REVOKED
    if row[1] is not None:
        return ORGANIZATION_SUSPENDED
    return ""
