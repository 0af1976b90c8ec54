"""``run_start``: the run locked and checked, then one call of ``runs.run_start``
draws the credits, moves the run to PENDING, opens attempt 1 and writes its reservation,
its ledger entry and the two events; nothing at all when the credits are short. Each case
checks every row a start leaves: the run, its attempt, its reservation, its ledger entry,
its events, the organization's balance and the message sent. The pick-up that follows
parses the plan before writing anything.
"""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from billing.models import LedgerEntry, Organization, Reservation
from billing.services import InsufficientCredits, to_credits
from common.invariants import violations
from runs import services
from runs.engine import control
from runs.engine.start import run_start, stored_plan
from runs.models import Agent, Run, RunAttempt
from runs.outbox import RunMessage
from runs.reservation import plan_reservation
from runs.selectors import run_history
from tests import factories
from tests.runs.engine.harness import RecordingTransport

pytestmark = pytest.mark.django_db

Starter = Callable[[Run], Run]


@pytest.fixture
def at_once(django_capture_on_commit_callbacks: Any) -> Starter:
    def start(run: Run) -> Run:
        with django_capture_on_commit_callbacks(execute=True):
            return run_start(run_id=run.pk, actor="api:test")

    return start


def left_behind(run: Run, returned: Run) -> dict[str, Any]:
    """Every row ``run_start`` wrote for ``run``, ids replaced by names."""
    stored = Run.objects.get(pk=run.pk)
    attempt = RunAttempt.objects.get(run=run)
    reservation = Reservation.objects.get(run_id=run.pk)
    entry = LedgerEntry.objects.get(run_id=run.pk)
    events = list(run_history(run).order_by("id"))
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
def test_a_start_leaves_the_run_pending_with_its_attempt_reservation_and_events(
    name: str, at_once: Starter, transport: RecordingTransport
) -> None:
    organization = factories.org(credits=1000)
    run = factories.run(organization, **PLANS[name])
    amount = to_credits(plan_reservation(stored_plan(run)))

    with CaptureQueriesContext(connection) as statements:
        returned = at_once(run)

    found = left_behind(run, returned)
    assert found.pop("events")[1:] == [  # after the creation's
        (1, "run", True, "transition", "created", "pending", "api:test", "", {}),
        (
            1,
            "run",
            True,
            "charge",
            "",
            "",
            "api:test",
            f"reserved {amount} credits",
            {"type": "reserve", "amount": str(amount)},
        ),
    ]
    assert found == {
        "returned": ("pending", 1, True, True, True),
        "run": ("pending", 1, None, None),
        "attempt": (1, None, ""),
        "reservation": (True, True, 1, amount, 0, 0, None),
        "ledger": (
            True,
            True,
            None,
            "reserve",
            amount,
            True,
            "run <run> attempt 1",
            "api:test",
        ),
    }
    assert Organization.objects.get(pk=organization.pk).credits_available == 1000 - amount
    assert transport.runs == [(RunMessage.PICK_UP, str(run.pk))]
    # The lock (with the plan), admission's lock with its count of the organization's
    # runs (one statement, runs.run_admission), and the call, inside run_start's
    # transaction (a savepoint here: the test runs in a transaction of its own).
    written = [q["sql"] for q in statements.captured_queries if "SAVEPOINT" not in q["sql"]]
    assert len(written) == 3, written
    assert violations() == {}


def test_too_few_credits_writes_nothing_and_refuses(
    at_once: Starter, transport: RecordingTransport
) -> None:
    organization = factories.org(credits=1)
    run = factories.run(organization, credits=5)
    events = run_history(run).count()

    with pytest.raises(InsufficientCredits):
        at_once(run)

    assert Run.objects.get(pk=run.pk).status == "created"
    assert not RunAttempt.objects.filter(run=run).exists()
    assert not Reservation.objects.filter(run_id=run.pk).exists()
    assert not LedgerEntry.objects.filter(run_id=run.pk).exists()
    assert run_history(run).count() == events
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
        run_start(run_id=run.pk, organization=stranger)

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
    assert violations() == {}


def test_a_duplicate_pick_up_changes_nothing(
    at_once: Starter, django_capture_on_commit_callbacks: Any
) -> None:
    run = factories.run(steps=2)
    at_once(run)
    with django_capture_on_commit_callbacks(execute=True):
        assert control.pick_up(run.pk) is True
    events = run_history(run).count()

    with django_capture_on_commit_callbacks(execute=True):
        assert control.pick_up(run.pk) is False

    assert run_history(run).count() == events
    assert Agent.objects.filter(run=run).count() == 1
