"""Billing invariants: credits conserved, an honest cache, and no
entry or reservation that names a row gone.

A step attempt's charge draws on its run attempt's reservation (``charged``) and reaches
the ledger only when the attempt settles, as one charge entry: so the ledger and the
reservations agree on every settled attempt, while an attempt still running has its
charges on its reservation alone.
"""

from __future__ import annotations

from typing import Any

from django.db.models import DecimalField, F, OuterRef, Q, QuerySet, Subquery, Sum
from django.db.models.functions import Coalesce

from billing.models import EntryType, LedgerEntry, Organization, Reservation
from billing.selectors import ZERO
from common.invariants import LIMIT, invariant, orphans


@invariant("billing.cached_balances", "cached balances equal the ledger")
def cached_balances() -> list[str]:
    """Set-based: one aggregate over the ledger and one over reservations, for every org.
    Available is the ledger's grants less its reservations plus its refunds; what the
    reservations hold and spent (their reserved less refunded) is the ledger's
    reservations less its refunds, whether or not the charges are entered yet."""
    ledger: dict[Any, dict[str, Any]] = {
        row["organization_id"]: dict(row)
        for row in LedgerEntry.objects.values("organization_id").annotate(
            **{t: Coalesce(Sum("amount", filter=Q(type=t)), ZERO) for t in EntryType.values}
        )
    }
    kept: dict[Any, Any] = dict(
        Reservation.objects.values("organization_id")
        .annotate(kept=Coalesce(Sum(F("reserved") - F("refunded")), ZERO))
        .values_list("organization_id", "kept")
    )
    problems = []
    empty = dict.fromkeys(EntryType.values, ZERO)
    for org_id, available in Organization.objects.values_list("pk", "credits_available"):
        totals = ledger.get(org_id, empty)
        available_said = totals["grant"] - totals["reserve"] + totals["refund"]
        expected = (available_said, totals["reserve"] - totals["refund"])
        actual = (available, kept.get(org_id, ZERO))
        if actual != expected:
            problems.append(
                f"organization {org_id}: available, and reserved and spent {actual} "
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


def _entered(entry_type: str) -> Coalesce:
    """The sum of the attempt's ledger entries of ``entry_type`` (index ledger_attempt_type)."""
    entries = (
        LedgerEntry.objects.filter(attempt_id=OuterRef("attempt_id"), type=entry_type)
        .order_by()
        .values("attempt_id")
        .annotate(total=Sum("amount"))
        .values("total")
    )
    return Coalesce(Subquery(entries, output_field=DecimalField()), ZERO)


def reservations_with_entries() -> QuerySet[Reservation]:
    """Every reservation with what the ledger holds of its attempt, by type: ``reserve_in``,
    ``charge_in``, ``refund_in``."""
    return Reservation.objects.annotate(
        reserve_in=_entered(EntryType.RESERVE),
        charge_in=_entered(EntryType.CHARGE),
        refund_in=_entered(EntryType.REFUND),
    )


@invariant(
    "billing.reservations",
    "per run attempt: the reservation equals its ledger (its charges entered when it "
    "settles); settled => charged + refunded = reserved",
)
def reservations_balanced() -> list[str]:
    """Set-based, one statement. Unsettled, the ledger holds none of the attempt's charges
    but those entered per step attempt before charges were counted (never more than
    ``charged``); settled, all of them."""
    settled = Q(settled_at__isnull=False)
    off = reservations_with_entries().filter(
        ~Q(reserved=F("reserve_in"))
        | ~Q(refunded=F("refund_in"))
        | (settled & ~Q(reserved=F("charged") + F("refunded")))
        | (settled & ~Q(charged=F("charge_in")))
        | (~settled & Q(charge_in__gt=F("charged")))
    )
    columns = ("reserved", "charged", "refunded", "reserve_in", "charge_in", "refund_in")
    return [
        f"reservation of run {r['run_id']} attempt {r['attempt_number']} "
        f"({'settled' if r['settled_at'] else 'open'}): reserved, charged, refunded "
        f"{(r['reserved'], r['charged'], r['refunded'])} but the ledger holds "
        f"{(r['reserve_in'], r['charge_in'], r['refund_in'])}"
        for r in off.values("run_id", "attempt_number", "settled_at", *columns)[:LIMIT]
    ]


@invariant(
    "billing.orphans",
    "every ledger entry's and reservation's organization, run, attempt and step exists",
)
def billing_orphans() -> list[str]:
    """Links the database does not check (billing.models.LedgerEntry): each is written
    from the rows it names, which are never deleted; none should be missing."""
    return orphans("billing")
