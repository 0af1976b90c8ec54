"""Two processes race conflicting transitions on the same runs, hundreds of times.

Each process has its own PostgreSQL connection; a barrier releases both at once for
every run, so they really contend for the row lock. The row lock and the transition
table must make the outcome deterministic: exactly one winner, exactly one event.
"""

from __future__ import annotations

from typing import Any

import pytest

from common.invariants import violations
from runs import services
from runs.admission import fairness, run_admission
from runs.engine.start import run_start
from runs.models import Run
from runs.selectors import run_history
from tests import factories, race_support

pytestmark = pytest.mark.django_db(transaction=True)

ROUNDS = 200


def race(first: str, second: str, run_ids: list[str]) -> dict[str, list[str]]:
    """Run operations ``first`` and ``second`` against each run, from two processes."""
    outcomes = race_support.contend([(first, run_ids), (second, run_ids)])
    return dict(zip((first, second), outcomes, strict=True))


def running_runs(count: int) -> list[str]:
    organization = factories.org()
    ids = []
    for _ in range(count):
        run = factories.run(organization, steps=1)
        run_start(run_id=run.pk)
        services.run_pick_up(run_id=run.pk)
        ids.append(str(run.pk))
    return ids


def test_complete_racing_fail_has_exactly_one_winner_per_run() -> None:
    run_ids = running_runs(ROUNDS)

    outcomes = race("complete", "fail", run_ids)
    a, b = outcomes["complete"], outcomes["fail"]

    for index, run_id in enumerate(run_ids):
        assert sorted([a[index], b[index]]) == ["refused", "won"], run_id
        terminal_events = run_history(run_id).filter(
            entity="run", to_status__in=["completed", "failed"]
        )
        assert terminal_events.count() == 1
        run = Run.objects.get(pk=run_id)
        assert run.status == terminal_events.get().to_status
    assert violations() == {}


def test_cancel_racing_start_is_consistent_per_run() -> None:
    organization = factories.org()
    run_ids = [str(factories.run(organization, steps=1).pk) for _ in range(ROUNDS)]

    race("start", "cancel", run_ids)

    for run_id in run_ids:
        run = Run.objects.get(pk=run_id)
        transitions = list(
            run_history(run_id)
            .filter(entity="run", kind="transition")
            .order_by("id")
            .values_list("from_status", "to_status")
        )
        assert run.status == "cancelled"  # cancel always lands; start may or may not
        # Either cancel came first (start refused), or start then cancel, never more.
        assert transitions in (
            [("created", "cancelled")],
            [("created", "pending"), ("pending", "cancelled")],
        )
        assert (run.attempt_number == 1) == (len(transitions) == 2)
    assert violations() == {}


# --------------------------------------------------------------------------- fairness
FAIR_ROUNDS = 100


@pytest.fixture
def long_leases(settings: Any) -> None:
    """Slots taken while the rounds are set up must not expire before their round (the
    test settings' lease is 3 s): an expired slot is free to take, rightly. (race_support
    carries the setting to the contenders.)"""
    settings.ENGINE_LEASE_SECONDS = 600


def test_two_runs_started_at_once_never_exceed_the_running_limit() -> None:
    pairs = []
    for _ in range(FAIR_ROUNDS):
        organization = factories.org()
        run_admission.limits_set(organization.pk, actor="test", max_running_runs=1)
        left, right = (factories.run(organization, steps=1) for _ in range(2))
        pairs.append(f"{left.pk}|{right.pk}")

    outcomes = race("start_left", "start_right", pairs)

    for index, pair in enumerate(pairs):
        sides = [outcomes["start_left"][index], outcomes["start_right"][index]]
        assert sorted(sides) == ["refused", "won"], pair
        runs = Run.objects.filter(pk__in=pair.split("|"))
        assert {run.status for run in runs} == {"pending"}
        assert runs.filter(admitted_at__isnull=False).count() == 1
        # The other waits; at its pick-up it is told why.
        waiting = runs.get(admitted_at__isnull=True)
        assert not run_admission.admit(waiting.pk)
        assert Run.objects.get(pk=waiting.pk).queued_reason == (
            "the organization has 1 runs running, its limit (max_running_runs 1)"
        )


@pytest.mark.usefixtures("long_leases")
def test_two_workers_taking_the_last_slot_at_once_never_exceed_the_step_limit() -> None:
    organizations = []
    for _ in range(FAIR_ROUNDS):
        organization = factories.org()
        run_admission.limits_set(organization.pk, actor="test", max_running_steps=1)
        organizations.append(str(organization.pk))

    outcomes = race("take_slot", "take_slot_too", organizations)

    for index, organization_id in enumerate(organizations):
        sides = [outcomes["take_slot"][index], outcomes["take_slot_too"][index]]
        assert sorted(sides) == ["refused", "won"], organization_id
        assert fairness.steps_executing(organization_id) == 1


@pytest.mark.usefixtures("long_leases")
def test_a_worker_freeing_a_slot_while_another_takes_one_never_exceeds_the_step_limit() -> None:
    organizations = []
    for _ in range(FAIR_ROUNDS):
        organization = factories.org()
        run_admission.limits_set(organization.pk, actor="test", max_running_steps=2)
        assert fairness.acquire_slot(organization.pk, "leaving") is not None
        assert fairness.acquire_slot(organization.pk, "staying") is not None
        organizations.append(str(organization.pk))

    outcomes = race("free_and_take_slot", "take_slot", organizations)

    for index, organization_id in enumerate(organizations):
        sides = [outcomes["free_and_take_slot"][index], outcomes["take_slot"][index]]
        # One slot was freed: one of the two takes it, never both.
        assert sorted(sides) == ["refused", "won"], organization_id
        assert fairness.steps_executing(organization_id) == 2
