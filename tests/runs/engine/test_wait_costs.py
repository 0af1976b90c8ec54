"""What a `wait` step costs and how many an organization may park
(runs.admission.step_admission.timer),
in process against PostgreSQL: its time is charged once, as it parks, per started day,
and reserved when its run starts; past the organization's quota `parked_waits` (exactly,
two parks at once included) or beyond its run's reservation, its attempt fails instead
of parking (docs/api.md, "Waits"; docs/tenants.md)."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.db import connection, transaction
from django.utils import timezone
from rest_framework.test import APIClient

from billing import quotas
from billing.models import LedgerEntry
from billing.services import api_key_create
from orchestrator import executor
from runs import services
from runs.admission import step_admission
from runs.models import RunAttempt, Step
from runs.plan import parse_plan
from runs.reservation import plan_reservation
from tests import factories
from tests.runs.engine.harness import waits
from tests.support import wait_until

DAY = Decimal("0.01")  # BILLING_WAIT_PRICE_PER_DAY
HOUR_MS = 3_600_000
# Timeouts longer than the waits here (a task's is an hour by default).
LONG = {"run": "7d", "agent": "7d", "task": "7d"}


# --------------------------------------------------------------------------- price
def test_a_plan_reserves_the_days_its_waits_may_hold() -> None:
    in_three_days = (datetime.now(UTC) + timedelta(days=3, hours=-1)).isoformat()

    assert plan_reservation(parse_plan(waits({"for": "20m"}))) == DAY
    assert plan_reservation(parse_plan(waits({"for": "25h"}))) == 2 * DAY
    assert plan_reservation(parse_plan(waits({"for": "1d"}, {"until": in_three_days}))) == 4 * DAY
    # A template is read only when the step starts: the longest wait there is.
    templated = waits({"for": "${variables.pause}"}) | {"variables": {"pause": "1s"}}
    assert plan_reservation(parse_plan(templated)) == 366 * DAY
    # Already past: nothing to hold (the reservation's floor, BILLING_MIN_RESERVATION).
    assert plan_reservation(parse_plan(waits({"until": "2020-01-01T00:00:00Z"}))) == DAY


@pytest.mark.django_db
def test_a_wait_is_charged_its_started_days_once_as_it_parks_and_nothing_as_it_wakes(
    engine_run: Any,
) -> None:
    run = engine_run(waits({"for": "25h"}, timeouts=LONG))

    admission = run.park("w0", 25 * HOUR_MS)

    assert admission.reason == step_admission.TIMER
    step = run.step("w0")
    assert (step.status, step.cost) == ("pending", 2 * DAY)
    reservation = RunAttempt.objects.get(run=run.run).reservation
    assert reservation.charged == 2 * DAY  # its spend shows while it waits
    charges = LedgerEntry.objects.filter(run=run.run, type="charge")
    assert not charges.exists()  # entered when the attempt settles
    # Its time comes (the database's clock reads the test transaction's start): the
    # claim that wakes it runs the tool and records the attempt.
    Step.objects.filter(pk=step.pk).update(next_run_at=timezone.now() - timedelta(hours=1))
    with run.committed():
        assert executor.execute_step(step.pk, worker="w", task_id="wake") == "completed"

    woken = run.step("w0")
    assert (woken.status, woken.attempts, woken.cost) == ("completed", 1, 2 * DAY)
    assert run.refresh().status == "completed"
    reservation = RunAttempt.objects.get(run=run.run).reservation
    assert (reservation.reserved, reservation.charged) == (2 * DAY, 2 * DAY)
    assert list(charges.values_list("amount", "idempotency_key")) == [
        (2 * DAY, f"charge:{reservation.attempt_id}")
    ]


@pytest.mark.django_db
def test_a_timer_asked_again_for_the_attempt_it_parked_charges_nothing_more(
    engine_run: Any,
) -> None:
    run = engine_run(waits({"for": "25h"}, timeouts=LONG))
    step = run.step("w0")
    attempt = run.claim("w0")

    def ask() -> step_admission.Admission:
        return step_admission.timer(
            step_id=step.pk, run_id=run.run.pk, attempt=attempt, until=None, for_ms=25 * HOUR_MS
        )

    with run.committed():
        parked, again = ask(), ask()  # a redelivered message of the same claim

    assert (parked.reason, again.dropped) == (step_admission.TIMER, True)
    assert run.step("w0").cost == 2 * DAY
    assert RunAttempt.objects.get(run=run.run).reservation.charged == 2 * DAY


@pytest.mark.django_db
def test_a_wait_pays_only_up_to_the_timeout_that_would_end_it(engine_run: Any) -> None:
    run = engine_run(waits({"for": "30d"}, timeouts={"run": "2d", "agent": "7d", "task": "7d"}))

    run.park("w0", 30 * 24 * HOUR_MS)

    # Two days at most, whatever it asked: the run's timeout ends it then.
    assert run.step("w0").cost == 2 * DAY
    assert run.step("w0").next_run_at is not None  # its wake time is what it asked


@pytest.mark.django_db
def test_a_wait_beyond_its_runs_reservation_fails_with_budget_exhausted_and_holds_nothing(
    engine_run: Any,
) -> None:
    run = engine_run(waits({"for": "3d"}, credits="0.02", timeouts=LONG))

    admission = run.park("w0", 3 * 24 * HOUR_MS)

    assert admission.code == "budget_exhausted"
    assert admission.until is None
    step = run.step("w0")
    assert (step.status, step.waiting_reason, step.next_run_at, step.cost) == (
        "running",  # the attempt then fails as any refused attempt does
        "",
        None,
        Decimal(0),
    )
    assert RunAttempt.objects.get(run=run.run).reservation.charged == Decimal(0)


# --------------------------------------------------------------------------- quota
@pytest.mark.django_db
def test_a_wait_past_the_quota_of_parked_waits_fails_with_quota_exceeded(
    engine_run: Any, settings: Any
) -> None:
    settings.QUOTA_PARKED_WAITS = 2
    organization = factories.org()
    first = engine_run(waits({"for": "1h"}, {"for": "1h"}), organization=organization)
    second = engine_run(waits({"for": "1h"}), organization=organization)
    assert first.park("w0", HOUR_MS).reason == step_admission.TIMER
    assert first.park("w1", HOUR_MS).reason == step_admission.TIMER

    refused = second.park("w0", HOUR_MS)

    assert refused.code == "quota_exceeded"
    assert refused.refused == (
        "the organization has 2 wait steps parked, its quota; let one wake or cancel its run, "
        "or ask an operator to raise the quota"
    )
    assert second.step("w0").waiting_reason == ""
    assert RunAttempt.objects.get(run=second.run).reservation.charged == Decimal(0)
    # GET /organization shows the quota and its use; a run that ends frees its places.
    _, key = api_key_create(organization=organization)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    shown = client.get("/api/v1/organization").json()["quotas"]["parked_waits"]
    assert shown == {"limit": 2, "used": 2}
    with first.committed():
        services.run_cancel(run_id=first.run.pk, reason="enough waiting")
    assert step_admission.timers_held(organization.pk).count() == 0
    assert engine_run(waits({"for": "1h"}), organization=organization).park("w0", HOUR_MS).until


def _waiting_for_a_quota_lock() -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
            "AND classid = %s",
            [quotas.LOCK_NAMESPACE],
        )
        return bool(cursor.fetchone()[0])


@pytest.mark.django_db(transaction=True)
def test_two_waits_parking_at_once_never_both_take_the_last_place(engine_run: Any) -> None:
    """The first park holds its transaction open after its check; the second must wait
    for it (seen in pg_locks), then count the first and be refused. Without the quota's
    lock the second counts only what was committed, and both park."""
    organization = factories.org()
    quotas.quotas_set(organization.pk, actor="test", parked_waits=1)
    runs = [engine_run(waits({"for": "1h"}), organization=organization) for _ in range(2)]
    attempts = [run.claim("w0") for run in runs]
    first_checked, first_may_commit = threading.Event(), threading.Event()
    outcomes: dict[str, str] = {}

    def timer(n: int) -> step_admission.Admission:
        return step_admission.timer(
            step_id=runs[n].step("w0").pk,
            run_id=runs[n].run.pk,
            attempt=attempts[n],
            until=None,
            for_ms=HOUR_MS,
        )

    def first() -> None:
        try:
            with transaction.atomic():
                outcomes["first"] = timer(0).reason
                first_checked.set()
                first_may_commit.wait(30)
        finally:
            connection.close()

    def second() -> None:
        try:
            admission = timer(1)
            outcomes["second"] = admission.code if admission.refused else admission.reason
        finally:
            connection.close()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    threads[0].start()
    assert first_checked.wait(30)
    threads[1].start()
    wait_until(_waiting_for_a_quota_lock, what="the second park to wait for the quota's lock")
    first_may_commit.set()
    for thread in threads:
        thread.join(30)

    assert outcomes == {"first": step_admission.TIMER, "second": "quota_exceeded"}
    assert step_admission.timers_held(organization.pk).count() == 1
