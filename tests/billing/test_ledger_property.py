"""Random grant / reserve / charge / settle sequences, with duplicate replays (hypothesis).

Every billing invariant must hold after every step: cached balances equal the ledger,
nothing is negative, every settled attempt has charged + refunded = reserved and its
charges entered as one entry, and every attempt charged what its steps cost. The others
(a run's states, its hierarchy, artifacts) are checked once at each example's end: all
of them after every step cost this test four fifths of its time.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from django.db import transaction
from django.db.models import Sum
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    invariant,
    rule,
    run_state_machine_as_test,
)

from billing.models import LedgerEntry, Reservation
from billing.services import (
    BudgetExhausted,
    InsufficientCredits,
    credits_grant,
    credits_reserve,
    credits_settle,
)
from common.invariants import violations
from runs import services
from runs.engine.start import run_start
from runs.models import Run, RunAttempt, Step
from runs.states import InvalidTransition
from tests import factories

amounts = st.decimals(min_value=Decimal("0.01"), max_value=Decimal(50), places=2)
# The invariants of the books: billing's own, and those of runs that read the ledger.
BILLING = (
    "billing.",
    "runs.attempt_charges",
    "runs.attempts_settled",
    "runs.borrowed_steps_uncharged",
)
REFUSED = (InsufficientCredits, BudgetExhausted, InvalidTransition, services.AttemptsExhausted)


class Ledger(RuleBasedStateMachine):
    runs = Bundle("runs")

    def __init__(self) -> None:
        super().__init__()
        self._atomic = transaction.atomic()
        self._atomic.__enter__()
        self.organization = factories.org(credits=0)

    def teardown(self) -> None:
        try:
            assert violations() == {}
        finally:
            transaction.set_rollback(True)
            self._atomic.__exit__(None, None, None)

    def _books(self) -> tuple[Any, ...]:
        return (
            LedgerEntry.objects.count(),
            Reservation.objects.aggregate(total=Sum("charged"))["total"],
            Step.objects.aggregate(total=Sum("cost"))["total"],
        )

    def _try(self, operation: Any) -> None:
        books = self._books()
        try:
            with transaction.atomic():
                operation()
        except REFUSED:
            assert self._books() == books  # a refusal writes nothing

    def _attempt(self, run: Run) -> RunAttempt | None:
        run = Run.objects.get(pk=run.pk)
        return RunAttempt.objects.filter(run=run, attempt_number=run.attempt_number).first()

    @rule(amount=amounts, key=st.sampled_from(["a", "b", "c", None]))
    def grant(self, amount: Decimal, key: str | None) -> None:
        credits_grant(
            organization=self.organization, amount=amount, reason="test", idempotency_key=key
        )

    @rule(target=runs, credits=amounts)
    def create(self, credits: Decimal) -> Run:
        return factories.run(self.organization, credits=str(credits), steps=3)

    @rule(run=runs)
    def start_and_pick_up(self, run: Run) -> None:
        def operation() -> None:
            run_start(run_id=run.pk)
            services.run_pick_up(run_id=run.pk)

        self._try(operation)

    @rule(run=runs, index=st.integers(0, 2), amount=amounts)
    def charge(self, run: Run, index: int, amount: Decimal) -> None:
        attempt = self._attempt(run)
        steps = (
            list(
                Step.objects.filter(run=run, attempt_number=attempt.attempt_number).order_by(
                    "position"
                )
            )
            if attempt
            else []
        )
        if attempt is None or not steps:
            return
        # A step attempt recorded, as the engine charges it (once: a duplicate recording
        # is the engine's to refuse, tests/runs/engine/test_outcomes.py).
        self._try(lambda: factories.charge(steps[index], amount))

    @rule(run=runs, cancel=st.booleans())
    def finish(self, run: Run, cancel: bool) -> None:
        if cancel:
            self._try(lambda: services.run_cancel(run_id=run.pk))
        else:
            self._try(lambda: services.run_fail(run_id=run.pk, code="tool_error", message="x"))

    @rule(run=runs)
    def retry(self, run: Run) -> None:
        self._try(lambda: services.run_retry(run_id=run.pk))

    @rule(run=runs)
    def replay_reserve_and_settle(self, run: Run) -> None:
        attempt = self._attempt(run)
        if attempt is None:
            return
        before = LedgerEntry.objects.count()
        # Keyed by attempt: a no-op.
        credits_reserve(
            organization_id=run.organization_id,
            run_id=run.pk,
            attempt_id=attempt.pk,
            attempt_number=attempt.attempt_number,
            amount="0.01",
        )
        assert LedgerEntry.objects.count() == before
        if attempt.reservation.settled_at is not None:
            credits_settle(run_id=run.pk, attempt_number=attempt.attempt_number)
            assert LedgerEntry.objects.count() == before

    @invariant()
    def billing_invariants_hold(self) -> None:
        assert violations(*BILLING) == {}


@pytest.mark.django_db
def test_random_billing_sequences_keep_every_invariant() -> None:
    run_state_machine_as_test(
        Ledger,
        settings=settings(
            max_examples=15,
            stateful_step_count=25,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
