"""Billing invariants (seed 000 invariants 1 and 6): conservation and an honest cache."""

from __future__ import annotations

from typing import Any

from django.db.models import F, Q, Sum
from django.db.models.functions import Coalesce

from billing.models import EntryType, LedgerEntry, Organization, Reservation
from billing.selectors import ZERO, balance_from_totals, ledger_totals
from common.invariants import LIMIT, invariant


@invariant("billing.cached_balances", "cached balances equal the ledger")
def cached_balances() -> list[str]:
    """Set-based: one aggregate over the ledger and one over reservations, for every org."""
    ledger: dict[Any, dict[str, Any]] = {
        row["organization_id"]: dict(row)
        for row in LedgerEntry.objects.values("organization_id").annotate(
            **{t: Coalesce(Sum("amount", filter=Q(type=t)), ZERO) for t in EntryType.values}
        )
    }
    held: dict[Any, dict[str, Any]] = {
        row["organization_id"]: dict(row)
        for row in Reservation.objects.values("organization_id").annotate(
            reserved=Coalesce(
                Sum(
                    F("reserved") - F("charged") - F("refunded"), filter=Q(settled_at__isnull=True)
                ),
                ZERO,
            ),
            spent=Coalesce(Sum("charged"), ZERO),
        )
    }
    problems = []
    empty = dict.fromkeys(EntryType.values, ZERO)
    for org_id, available in Organization.objects.values_list("pk", "credits_available"):
        totals = ledger.get(org_id, empty)
        ledger_says = balance_from_totals(totals)
        expected = (ledger_says.available, ledger_says.reserved, ledger_says.spent)

        cached = held.get(org_id, {"reserved": ZERO, "spent": ZERO})
        actual = (available, cached["reserved"], cached["spent"])
        if actual != expected:
            problems.append(
                f"organization {org_id}: available/reserved/spent {actual} "
                f"but the ledger says {expected}"
            )
            if len(problems) >= LIMIT:
                break
    return problems


@invariant("billing.non_negative", "no balance is negative and every entry is positive")
def non_negative() -> list[str]:
    problems = [
        f"organization {pk}: negative balance"
        for pk in Organization.objects.filter(credits_available__lt=0).values_list("pk", flat=True)[
            :LIMIT
        ]
    ]
    problems += [
        f"ledger entry {pk}: amount not positive"
        for pk in LedgerEntry.objects.filter(amount__lte=0).values_list("pk", flat=True)[:LIMIT]
    ]
    return problems


@invariant(
    "billing.reservations",
    "per run attempt: the reservation equals its ledger; settled => charged+refunded=reserved",
)
def reservations_balanced() -> list[str]:
    problems = []
    settled_unbalanced = Reservation.objects.filter(settled_at__isnull=False).exclude(
        reserved=F("charged") + F("refunded")
    )
    problems += [
        f"reservation of run {r.run_id} attempt {r.attempt_number}: settled with reserved "
        f"{r.reserved} != charged {r.charged} + refunded {r.refunded}"
        for r in settled_unbalanced[:LIMIT]
    ]
    for reservation in Reservation.objects.all()[:5000]:
        totals = ledger_totals(LedgerEntry.objects.filter(attempt_id=reservation.attempt_id))
        cached = (reservation.reserved, reservation.charged, reservation.refunded)
        if cached != (totals["reserve"], totals["charge"], totals["refund"]):
            problems.append(
                f"reservation of run {reservation.run_id} attempt {reservation.attempt_number}: "
                f"{cached} differs from the ledger"
            )
            if len(problems) >= LIMIT:
                break
    return problems
