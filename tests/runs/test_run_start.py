"""``run_start`` in one statement writes exactly what the general path writes; the
pick-up that follows parses the plan before writing anything.

The run is locked and checked as before; then one statement draws the credits, moves the
run to PENDING, opens attempt 1 and writes its reservation, its ledger entry and the two
events (``runs.services._start_in_one_statement``). Each case here starts twin runs, one each way,
and compares every row they leave: the run, its attempt, its reservation, its ledger
entry, its events, the organization's balance and the message sent.
"""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from billing.models import LedgerEntry, Organization, Reservation
from billing.services import InsufficientCredits
from common.invariants import check_all
from runs import services
from runs.engine import control
from runs.models import Agent, Run, RunAttempt, RunEvent
from runs.outbox import RunMessage
from tests import factories
from tests.runs.engine.harness import RecordingTransport

pytestmark = pytest.mark.django_db

Starter = Callable[[Run], Run]


@pytest.fixture
def at_once(django_capture_on_commit_callbacks: Any) -> Starter:
    def start(run: Run) -> Run:
        with django_capture_on_commit_callbacks(execute=True):
            return services.run_start(run_id=run.pk, actor="api:test")

    return start


@pytest.fixture
def general(at_once: Starter, monkeypatch: pytest.MonkeyPatch) -> Starter:
    def start(run: Run) -> Run:
        with monkeypatch.context() as off:
            off.setattr(services, "_start_in_one_statement", lambda *args: None)
            return at_once(run)

    return start


def left_behind(run: Run, returned: Run) -> dict[str, Any]:
    """Every row ``run_start`` wrote for ``run``, ids replaced by names."""
    stored = Run.objects.get(pk=run.pk)
    attempt = RunAttempt.objects.get(run=run)
    reservation = Reservation.objects.get(run_id=run.pk)
    entry = LedgerEntry.objects.get(run_id=run.pk)
    events = list(RunEvent.objects.filter(run=run).order_by("id"))
    # The timestamps agree with each other within each start.
    assert stored.started_at == stored.status_changed_at
    assert stored.started_at <= attempt.created_at <= reservation.created_at
    assert events[-1].created_at >= stored.started_at
    assert entry.created_at >= stored.started_at
    return {
        "returned": (
            returned.status,
            returned.attempt_number,
            returned.started_at == stored.started_at,
            returned.status_changed_at == stored.status_changed_at,
            returned.updated_at == stored.updated_at,
        ),
        "run": (stored.status, stored.attempt_number, stored.picked_up_at, stored.completed_at),
        "attempt": (attempt.attempt_number, attempt.finished_at, attempt.outcome),
        "reservation": (
            reservation.organization_id == run.organization_id,
            reservation.attempt_id == attempt.pk,
            reservation.attempt_number,
            reservation.reserved,
            reservation.charged,
            reservation.refunded,
            reservation.settled_at,
        ),
        "ledger": (
            entry.organization_id == run.organization_id,
            entry.attempt_id == attempt.pk,
            entry.step_id,
            entry.type,
            entry.amount,
            entry.idempotency_key == f"reserve:{attempt.pk}",
            entry.reason.replace(str(run.pk), "<run>"),
            entry.actor,
        ),
        "events": [
            (
                e.attempt_number,
                e.entity,
                e.entity_id == str(run.pk),
                e.kind,
                e.from_status,
                e.to_status,
                e.actor,
                e.message,
                e.payload,
            )
            for e in events
        ],
    }


PLANS: dict[str, dict[str, Any]] = {
    "estimated from its steps": {"steps": 3},
    "credits given by the plan": {"steps": 2, "credits": 7.5},
    "two agents of two tasks": {"agents": 2, "tasks": 2, "steps": 3},
}


@pytest.mark.parametrize("name", list(PLANS))
def test_starting_at_once_leaves_what_the_general_path_leaves(
    name: str, at_once: Starter, general: Starter, transport: RecordingTransport
) -> None:
    organization = factories.org(credits=1000)
    slow, fast = (factories.run(organization, **PLANS[name]) for _ in range(2))

    returned_slow = general(slow)
    balance_after_slow = Organization.objects.get(pk=organization.pk).credits_available
    with CaptureQueriesContext(connection) as statements:
        returned_fast = at_once(fast)
    balance_after_fast = Organization.objects.get(pk=organization.pk).credits_available

    assert left_behind(fast, returned_fast) == left_behind(slow, returned_slow)
    drawn = Reservation.objects.get(run_id=slow.pk).reserved
    assert Decimal(1000) - balance_after_slow == drawn == balance_after_slow - balance_after_fast
    assert transport.runs == [
        (RunMessage.PICK_UP, str(slow.pk)),
        (RunMessage.PICK_UP, str(fast.pk)),
    ]
    # The lock (with the plan), admission's lock and count of the organization's runs
    # waiting to start (runs.admission), and the statement, inside run_start's
    # transaction (a savepoint here: the test runs in a transaction of its own).
    written = [q["sql"] for q in statements.captured_queries if "SAVEPOINT" not in q["sql"]]
    assert len(written) == 4, written
    assert {check: found for check, found in check_all().items() if found} == {}


def test_too_few_credits_writes_nothing_and_refuses_as_before(
    at_once: Starter, transport: RecordingTransport
) -> None:
    organization = factories.org(credits=1)
    run = factories.run(organization, credits=5)
    events = RunEvent.objects.filter(run=run).count()

    with pytest.raises(InsufficientCredits):
        at_once(run)

    assert Run.objects.get(pk=run.pk).status == "created"
    assert not RunAttempt.objects.filter(run=run).exists()
    assert not Reservation.objects.filter(run_id=run.pk).exists()
    assert not LedgerEntry.objects.filter(run_id=run.pk).exists()
    assert RunEvent.objects.filter(run=run).count() == events
    assert Organization.objects.get(pk=organization.pk).credits_available == Decimal(1)
    assert transport.runs == []


def test_exactly_the_credits_available_are_enough(at_once: Starter) -> None:
    organization = factories.org(credits=5)
    run = factories.run(organization, credits=5)

    assert at_once(run).status == "pending"
    assert Organization.objects.get(pk=organization.pk).credits_available == Decimal(0)


def test_a_second_start_changes_nothing(at_once: Starter, transport: RecordingTransport) -> None:
    run = factories.run()
    first = at_once(run)
    rows = left_behind(run, first)

    again = at_once(run)

    assert left_behind(run, again) == rows
    assert RunAttempt.objects.filter(run=run).count() == 1
    assert LedgerEntry.objects.filter(run_id=run.pk).count() == 1


def test_another_organizations_run_is_not_found_and_untouched(at_once: Starter) -> None:
    run = factories.run()
    stranger = factories.org()

    with pytest.raises(services.RunNotFound):
        services.run_start(run_id=run.pk, organization=stranger)

    assert Run.objects.get(pk=run.pk).status == "created"
    assert not RunAttempt.objects.filter(run=run).exists()


def test_a_stored_plan_that_no_longer_validates_fails_the_run_at_pick_up(
    at_once: Starter, transport: RecordingTransport, django_capture_on_commit_callbacks: Any
) -> None:
    organization = factories.org(credits=100)
    run = factories.run(organization, credits=5)
    at_once(run)
    # As if the validator grew stricter after the run was created.
    Run.objects.filter(pk=run.pk).update(plan={"name": "stale", "agents": []})

    with django_capture_on_commit_callbacks(execute=True):
        picked = control.pick_up(run.pk)

    stored = Run.objects.get(pk=run.pk)
    assert picked is False
    assert (stored.status, stored.last_error["code"]) == ("failed", "invalid_plan")
    assert not Agent.objects.filter(run=run).exists()
    assert Reservation.objects.get(run_id=run.pk).settled_at is not None
    assert Organization.objects.get(pk=organization.pk).credits_available == Decimal(100)
    assert transport.steps == []
    assert {check: found for check, found in check_all().items() if found} == {}


def test_a_duplicate_pick_up_changes_nothing(
    at_once: Starter, django_capture_on_commit_callbacks: Any
) -> None:
    run = factories.run(steps=2)
    at_once(run)
    with django_capture_on_commit_callbacks(execute=True):
        assert control.pick_up(run.pk) is True
    events = RunEvent.objects.filter(run=run).count()

    with django_capture_on_commit_callbacks(execute=True):
        assert control.pick_up(run.pk) is False

    assert RunEvent.objects.filter(run=run).count() == events
    assert Agent.objects.filter(run=run).count() == 1
