"""Billing invariants (seed 000 invariants 1 and 6): conservation and an honest cache."""

from __future__ import annotations

from django.db.models import F

from billing.models import LedgerEntry, Organization
from billing.selectors import balance_from_ledger, ledger_totals, organization_balance
from orchestrator.invariants import LIMIT, invariant
from runs.models import RunAttempt


@invariant("billing.cached_balances", "cached balances equal the ledger")
def cached_balances() -> list[str]:
    problems = []
    for org in Organization.objects.iterator():
        ledger = balance_from_ledger(org)
        balance = organization_balance(org)
        cached = (balance.available, balance.reserved, balance.spent)
        if cached != (ledger.available, ledger.reserved, ledger.spent):
            problems.append(
                f"organization {org.pk}: available/reserved/spent {cached} "
                f"but ledger says {(ledger.available, ledger.reserved, ledger.spent)}"
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
