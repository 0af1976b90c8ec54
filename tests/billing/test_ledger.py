"""The credit ledger: append-only, exactly-once, never overdrawn, always balanced."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal

import pytest
from django.db import DatabaseError, connection, connections, transaction

from billing.models import LedgerEntry, Organization, Reservation
from billing.selectors import organization_balance
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
from tests import factories
from tests.factories import finish_all_work

pytestmark = pytest.mark.django_db


def assert_invariants_hold() -> None:
    assert violations() == {}


def reservation_of(run: Run, attempt_number: int = 1) -> Reservation:
    return Reservation.objects.get(run_id=run.pk, attempt_number=attempt_number)


def assert_settled(run: Run) -> Reservation:
    run = Run.objects.get(pk=run.pk)
    reservation = reservation_of(run, run.attempt_number)
    assert reservation.settled_at is not None
    assert reservation.charged + reservation.refunded == reservation.reserved
    return reservation


@pytest.mark.parametrize(
    "statement",
    ["UPDATE billing_ledgerentry SET amount = 1", "DELETE FROM billing_ledgerentry"],
)
def test_raw_sql_cannot_change_or_delete_ledger_entries(statement: str) -> None:
    organization = factories.org(credits=10)

    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        connection.cursor().execute(statement)

    assert LedgerEntry.objects.filter(organization=organization).count() == 1


@pytest.mark.parametrize(
    "statement", ["UPDATE runs_runevent SET message = 'x'", "DELETE FROM runs_runevent"]
)
def test_raw_sql_cannot_change_or_delete_run_events(statement: str) -> None:
    factories.run()

    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        connection.cursor().execute(statement)


def test_the_model_refuses_to_update_or_delete_an_entry() -> None:
    organization = factories.org(credits=10)
    entry = LedgerEntry.objects.get(organization=organization)

    with pytest.raises(ValueError, match="append-only"):
        entry.save()
    with pytest.raises(ValueError, match="append-only"):
        entry.delete()


def test_start_reserves_the_plans_credits_and_the_estimate_otherwise() -> None:
    organization = factories.org(credits=100)
    explicit = factories.run(organization, credits=12.5)
    estimated = factories.run(organization, steps=4)  # 4 noop x 0.01 x 3 attempts

    run_start(run_id=explicit.pk)
    run_start(run_id=estimated.pk)

    assert reservation_of(explicit).reserved == Decimal("12.5")
    assert reservation_of(estimated).reserved == Decimal("0.12")
    organization.refresh_from_db()
    assert organization_balance(organization).available == Decimal("87.38")
    assert organization_balance(organization).reserved == Decimal("12.62")
    assert_invariants_hold()


def test_start_with_too_little_available_fails_and_the_run_stays_created() -> None:
    organization = factories.org(credits=5)
    run = factories.run(organization, credits=10)

    with pytest.raises(InsufficientCredits) as raised:
        run_start(run_id=run.pk)

    assert raised.value.code == "insufficient_credits"
    stored = Run.objects.get(pk=run.pk)
    assert (stored.status, stored.attempt_number) == ("created", 0)
    assert not RunAttempt.objects.filter(run=run).exists()
    assert LedgerEntry.objects.filter(run=run).count() == 0
    assert_invariants_hold()


def test_charges_draw_on_the_reservation_and_reach_the_ledger_as_one_entry_at_settle() -> None:
    run = factories.run(credits=10, steps=2)
    run_start(run_id=run.pk)
    services.run_pick_up(run_id=run.pk)
    first, second = Step.objects.filter(run=run).order_by("pk")

    factories.charge(first, "0.5")
    factories.charge(second, "0.25")
    factories.charge(first, "0.5")  # its second attempt

    # While the run runs: on its reservation, and in the organization's spent.
    assert reservation_of(run).charged == Decimal("1.25")
    assert organization_balance(run.organization).spent == Decimal("1.25")
    assert not LedgerEntry.objects.filter(run=run, type="charge").exists()
    assert_invariants_hold()

    services.run_fail(run_id=run.pk, code="tool_error", message="boom")

    attempt = RunAttempt.objects.get(run=run)
    (entry,) = LedgerEntry.objects.filter(run=run, type="charge")
    assert (entry.amount, entry.idempotency_key, entry.attempt_id, entry.step_id) == (
        Decimal("1.25"),
        f"charge:{attempt.pk}",
        attempt.pk,
        None,
    )
    refund = LedgerEntry.objects.get(run=run, type="refund")
    assert entry.amount + refund.amount == Decimal(10)
    assert organization_balance(run.organization).spent == Decimal("1.25")
    assert_invariants_hold()


def test_an_attempt_that_charged_nothing_settles_with_no_charge_entry() -> None:
    run = factories.run(credits=10)
    run_start(run_id=run.pk)

    services.run_cancel(run_id=run.pk)

    assert not LedgerEntry.objects.filter(run=run, type="charge").exists()
    assert LedgerEntry.objects.get(run=run, type="refund").amount == Decimal(10)


def test_a_charge_beyond_the_reservation_is_refused_with_budget_exhausted() -> None:
    run = factories.run(credits=1)
    run_start(run_id=run.pk)
    services.run_pick_up(run_id=run.pk)
    step = Step.objects.filter(run=run).first()
    assert step is not None
    factories.charge(step, "0.75")

    with pytest.raises(BudgetExhausted) as raised:
        factories.charge(step, "0.5")

    assert raised.value.code == "budget_exhausted"
    assert reservation_of(run).charged == Decimal("0.75")
    assert Step.objects.get(pk=step.pk).cost == Decimal("0.75")


def test_a_charge_after_the_attempt_settled_is_refused() -> None:
    run = factories.run(credits=10)
    run_start(run_id=run.pk)
    services.run_pick_up(run_id=run.pk)
    step = Step.objects.filter(run=run).first()
    assert step is not None
    services.run_cancel(run_id=run.pk)

    with pytest.raises(BudgetExhausted):
        factories.charge(step, "0.5")

    assert reservation_of(run).charged == Decimal(0)
    assert_invariants_hold()


def _started_with_charges(credits: int = 10) -> Run:
    run = factories.run(credits=credits, steps=2)
    run_start(run_id=run.pk)
    services.run_pick_up(run_id=run.pk)
    for number, step in enumerate(Step.objects.filter(run=run).order_by("pk"), start=1):
        factories.charge(step, number)
    return Run.objects.get(pk=run.pk)


def test_completed_run_refunds_what_was_not_charged() -> None:
    run = _started_with_charges()

    with transaction.atomic():
        finish_all_work(services.lock_run(run.pk))
        services.run_complete(run_id=run.pk)

    reservation = assert_settled(run)
    assert (reservation.charged, reservation.refunded) == (Decimal(3), Decimal(7))
    assert_invariants_hold()


def test_failed_run_refunds_what_was_not_charged() -> None:
    run = _started_with_charges()

    services.run_fail(run_id=run.pk, code="tool_error", message="boom")

    assert assert_settled(run).refunded == Decimal(7)
    assert_invariants_hold()


def test_run_cancelled_before_start_reserved_nothing() -> None:
    run = factories.run(credits=10)

    services.run_cancel(run_id=run.pk)

    assert not LedgerEntry.objects.filter(run=run).exists()
    assert_invariants_hold()


def test_run_cancelled_while_pending_is_refunded_in_full() -> None:
    run = factories.run(credits=10)
    run_start(run_id=run.pk)

    services.run_cancel(run_id=run.pk, reason="not needed")

    assert assert_settled(run).refunded == Decimal(10)
    assert_invariants_hold()


def test_pending_timeout_refunds_in_full() -> None:
    run = factories.run(credits=10)
    run_start(run_id=run.pk)

    services.run_fail(run_id=run.pk, code="pending_timeout", message="not picked up in 24h")

    assert assert_settled(run).refunded == Decimal(10)
    assert_invariants_hold()


def test_retry_reserves_anew_for_the_new_attempt() -> None:
    run = _started_with_charges()
    services.run_fail(run_id=run.pk, code="tool_error", message="boom")

    services.run_retry(run_id=run.pk)

    reservations = list(Reservation.objects.filter(run_id=run.pk).order_by("attempt_number"))
    assert [r.reserved for r in reservations] == [Decimal(10), Decimal(10)]
    assert reservations[0].settled_at is not None
    assert reservations[1].settled_at is None
    assert_invariants_hold()


def test_settle_twice_refunds_once() -> None:
    run = factories.run(credits=10)
    run_start(run_id=run.pk)
    attempt = RunAttempt.objects.get(run=run)

    credits_settle(run_id=run.pk, attempt_number=1)
    credits_settle(run_id=run.pk, attempt_number=1)

    assert LedgerEntry.objects.filter(attempt=attempt, type="refund").count() == 1


def test_grant_with_the_same_key_grants_once() -> None:
    organization = factories.org(credits=0)

    credits_grant(organization=organization, amount=5, reason="promo", idempotency_key="k1")
    credits_grant(organization=organization, amount=5, reason="promo", idempotency_key="k1")

    organization.refresh_from_db()
    assert organization.credits_available == Decimal(5)
    assert LedgerEntry.objects.filter(organization=organization).count() == 1


@pytest.mark.django_db(transaction=True)
def test_concurrent_reservations_never_overdraw() -> None:
    organization = factories.org(credits="255")  # affords 25 runs of 10
    run_ids = [factories.run(organization, credits=10).pk for _ in range(50)]

    def start(run_id: object) -> str:
        try:
            run_start(run_id=run_id)  # type: ignore[arg-type]
            return "started"
        except InsufficientCredits:
            return "insufficient_credits"
        finally:
            connections.close_all()

    with ThreadPoolExecutor(max_workers=50) as pool:
        outcomes = list(pool.map(start, run_ids))

    assert outcomes.count("started") == 25
    assert outcomes.count("insufficient_credits") == 25
    organization = Organization.objects.get(pk=organization.pk)
    assert organization.credits_available == Decimal(5)
    assert Run.objects.filter(organization=organization, status="pending").count() == 25
    assert Run.objects.filter(organization=organization, status="created").count() == 25
    assert_invariants_hold()


def test_reserve_is_keyed_by_attempt() -> None:
    run = factories.run(credits=10)
    run_start(run_id=run.pk)
    attempt = RunAttempt.objects.get(run=run)

    again = credits_reserve(
        organization_id=run.organization_id,
        run_id=run.pk,
        attempt_id=attempt.pk,
        attempt_number=1,
        amount=10,
    )

    assert LedgerEntry.objects.filter(attempt=attempt, type="reserve").count() == 1
    assert LedgerEntry.objects.get(pk=again).amount == Decimal(10)
