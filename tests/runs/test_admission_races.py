"""Many starters of one organization at once: every admission rule holds exactly.

A start begins a small run before it takes the organization's locks (runs.engine.start:
the locks last), so that one organization's starts do their heavy part side by side.
Eight processes, each with its own PostgreSQL connection, start one run each of the same
organization at the same moment (a barrier per round), round after round: the running
limit, the pending limit, a concurrency key and the credits must come out exact, as if
the starts had gone one at a time. Each test fails when the organization's lock or the
check under it is taken away (the run's guess, ``run_admission.looks_free``, is only a guess).
"""

from __future__ import annotations

from collections import Counter
from decimal import Decimal
from typing import Any

import pytest

from billing.models import Organization
from billing.services import to_credits
from common.invariants import violations
from runs import services
from runs.admission import run_admission
from runs.engine.start import run_start, stored_plan
from runs.models import Run
from runs.reservation import plan_reservation
from tests import factories, race_support

pytestmark = pytest.mark.django_db(transaction=True)

STARTERS = 8
ROUNDS = 6


@pytest.fixture(autouse=True)
def start_at_once(settings: Any) -> None:
    """Small runs begin at their start, in the starters (race_support carries the
    setting to them) as in this process."""
    settings.ENGINE_START_AT_ONCE_STEPS = 200


def crowd(rounds: list[list[Any]]) -> list[Counter[str]]:
    """Start every run of each round from ``STARTERS`` processes at once (process i
    starts the i-th run of every round); what came of each round's starts."""
    jobs = [("start_outcome", [str(ids[index]) for ids in rounds]) for index in range(STARTERS)]
    collected = race_support.contend(jobs)
    return [Counter(outcomes[index] for outcomes in collected) for index in range(len(rounds))]


def rounds_of(
    make: Any, limits: dict[str, int] | None = None, credits: int | str = 1000
) -> list[list[Any]]:
    rounds = []
    for _ in range(ROUNDS):
        organization = factories.org(credits=credits)
        if limits:
            run_admission.limits_set(organization.pk, actor="test", **limits)
        rounds.append([make(organization).pk for _ in range(STARTERS)])
    return rounds


def holding_a_place(ids: list[Any]) -> int:
    return Run.objects.filter(run_admission.HOLDS_A_PLACE, pk__in=ids).count()


def assert_consistent() -> None:
    assert violations() == {}


def small(organization: Organization, **options: Any) -> Run:
    return factories.run(organization, steps=1, **options)


def test_starts_at_once_never_exceed_the_running_limit() -> None:
    rounds = rounds_of(small, {"max_running_runs": 2})

    outcomes = crowd(rounds)

    for ids, outcome in zip(rounds, outcomes, strict=True):
        assert outcome == Counter(running=2, waiting=STARTERS - 2), ids
        assert holding_a_place(ids) == 2
        waiting = Run.objects.filter(pk__in=ids, status="pending", admitted_at__isnull=True)
        assert waiting.count() == STARTERS - 2
    assert_consistent()


def test_starts_at_once_never_exceed_the_pending_limit() -> None:
    rounds = rounds_of(small, {"max_running_runs": 1, "max_pending_runs": 3})

    outcomes = crowd(rounds)

    for ids, outcome in zip(rounds, outcomes, strict=True):
        # The first to decide takes the place; three wait; the rest are refused and
        # left as they were.
        assert outcome == Counter(running=1, waiting=3, too_many_pending_runs=STARTERS - 4)
        assert Run.objects.filter(pk__in=ids, status="created").count() == STARTERS - 4
        assert Run.objects.filter(pk__in=ids, status="pending").count() == 3
    assert_consistent()


def test_starts_at_once_never_exceed_a_concurrency_key() -> None:
    def keyed(organization: Organization) -> Run:
        return small(organization, concurrency={"key": "shared", "max_runs": 2})

    rounds = rounds_of(keyed, {"max_running_runs": 50})

    outcomes = crowd(rounds)

    for ids, outcome in zip(rounds, outcomes, strict=True):
        assert outcome == Counter(running=2, waiting=STARTERS - 2)
        assert holding_a_place(ids) == 2
    assert_consistent()


def test_starts_at_once_never_overdraw_the_credits() -> None:
    # A one-step run reserves the same amount each: the organization affords three.
    amount = to_credits(plan_reservation(stored_plan(small(factories.org()))))
    rounds = rounds_of(small, {"max_running_runs": 50}, credits=str(amount * 3))

    outcomes = crowd(rounds)

    for ids, outcome in zip(rounds, outcomes, strict=True):
        assert outcome == Counter(running=3, insufficient_credits=STARTERS - 3)
        organization = Run.objects.get(pk=ids[0]).organization
        assert organization.credits_available == Decimal(0)
    assert_consistent()


def test_runs_that_waited_through_a_crowd_start_by_priority_then_in_order() -> None:
    organization = factories.org()
    run_admission.limits_set(organization.pk, actor="test", max_running_runs=1)
    holder = small(organization)
    run_start(run_id=holder.pk)
    priorities = [5, 3, 9, 3, 7, 1, 5, 3]
    ids = [small(organization, priority=priority).pk for priority in priorities]

    outcomes = crowd([ids])

    assert outcomes == [Counter(waiting=STARTERS)]
    # Their pick-ups (no worker here) find no place and say why.
    assert not any(run_admission.admit(pk) for pk in ids)
    services.run_cancel(run_id=holder.pk)
    first = run_admission.admit_waiting(organization.pk)
    # Priority first (1), then, among equals, the order they were created in.
    assert first == [ids[5]]
    order = sorted(range(STARTERS), key=lambda index: (priorities[index], index))
    waiting = (
        Run.objects.filter(run_admission.WAITING, organization=organization)
        .order_by("priority", "created_at", "pk")
        .values_list("pk", flat=True)
    )
    assert list(waiting) == [ids[index] for index in order]
    assert_consistent()
