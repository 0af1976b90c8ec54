"""Billing invariants (seed 000 invariants 1 and 6): conservation and an honest cache."""

from __future__ import annotations

from typing import Any

from django.db.models import F, Q, Sum
from django.db.models.functions import Coalesce

from billing.models import EntryType, LedgerEntry, Organization
from billing.selectors import ZERO, balance_from_totals, ledger_totals
from common.invariants import LIMIT, invariant
from runs.models import RunAttempt


@invariant("billing.cached_balances", "cached balances equal the ledger")
def cached_balances() -> list[str]:
    """Set-based: one aggregate over the ledger and one over attempts, for every org."""
    ledger: dict[Any, dict[str, Any]] = {
        row["organization_id"]: dict(row)
        for row in LedgerEntry.objects.values("organization_id").annotate(
            **{t: Coalesce(Sum("amount", filter=Q(type=t)), ZERO) for t in EntryType.values}
        )
    }
    held: dict[Any, dict[str, Any]] = {
        row["run__organization_id"]: dict(row)
        for row in RunAttempt.objects.values("run__organization_id").annotate(
            reserved=Coalesce(
                Sum(
                    F("credits_reserved") - F("credits_charged") - F("credits_refunded"),
                    filter=Q(settled_at__isnull=True),
                ),
                ZERO,
            ),
            spent=Coalesce(Sum("credits_charged"), ZERO),
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
    "billing.attempts", "per attempt: cache equals ledger; settled => charged+refunded=reserved"
)
def attempts_balanced() -> list[str]:
    problems = []
    settled_unbalanced = RunAttempt.objects.filter(settled_at__isnull=False).exclude(
        credits_reserved=F("credits_charged") + F("credits_refunded")
    )
    problems += [
        f"attempt {a.pk} (run {a.run_id}): settled with reserved {a.credits_reserved} != "
        f"charged {a.credits_charged} + refunded {a.credits_refunded}"
        for a in settled_unbalanced[:LIMIT]
    ]
    for attempt in RunAttempt.objects.filter(ledger_entries__isnull=False).distinct()[:5000]:
        totals = ledger_totals(LedgerEntry.objects.filter(attempt=attempt))
        cached = (attempt.credits_reserved, attempt.credits_charged, attempt.credits_refunded)
        if cached != (totals["reserve"], totals["charge"], totals["refund"]):
            problems.append(f"attempt {attempt.pk}: cached credits {cached} differ from ledger")
            if len(problems) >= LIMIT:
                break
    finished_unsettled = RunAttempt.objects.exclude(outcome="").filter(settled_at__isnull=True)
    problems += [
        f"attempt {pk}: finished but not settled"
        for pk in finished_unsettled.values_list("pk", flat=True)[:LIMIT]
    ]
    return problems
