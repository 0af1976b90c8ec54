"""Admission and fair dispatch on PostgreSQL's rows, in-process (docs/fairness.md): the
order in which waiting runs are admitted, concurrency keys, the slots that cap steps
executing, and ``next_run``'s choice between organizations and within one. The same with
a real worker is in tests/integration/test_fairness.py."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import transaction
from django.utils import timezone

from billing.models import Organization
from runs import services
from runs.admission import fairness, run_admission
from runs.engine import control
from runs.engine.start import run_start
from runs.models import EventKind, Run, StepSlot
from runs.plan import PlanInvalid
from runs.selectors import run_history
from runs.states import RUN_STARTED
from tests import factories

pytestmark = pytest.mark.django_db


def started(organization: Organization, *, priority: int = 5, **plan: Any) -> Run:
    run = services.run_create(
        organization=organization, plan=factories.plan(priority=priority, **plan)
    )
    return run_start(run_id=run.pk)


def keyed(organization: Organization, customer: str, *, priority: int = 5, most: int = 1) -> Run:
    return started(
        organization,
        priority=priority,
        variables={"customer": customer},
        concurrency={"key": "customer-${variables.customer}", "max_runs": most},
    )


def status(run: Run) -> str:
    return Run.objects.get(pk=run.pk).status


# --------------------------------------------------------------------------- admission
def test_runs_beyond_the_limit_wait_with_a_reason_and_an_event() -> None:
    organization = factories.org()
    run_admission.limits_set(organization.pk, actor="test", max_running_runs=2)
    runs = [started(organization) for _ in range(3)]

    picked = [control.pick_up(run.pk) for run in runs]

    assert picked == [True, True, False]
    waiting = Run.objects.get(pk=runs[2].pk)
    assert waiting.status == "pending"
    assert waiting.admitted_at is None
    assert waiting.queued_reason == (
        "the organization has 2 runs running, its limit (max_running_runs 2)"
    )
    event = run_history(waiting).get(kind=EventKind.QUEUE)
    assert event.message == f"waiting to start: {waiting.queued_reason}"
    assert event.payload == {"queued_reason": waiting.queued_reason}
    # Asked again with nothing changed: no second event.
    assert not control.pick_up(waiting.pk)
    assert run_history(waiting).filter(kind=EventKind.QUEUE).count() == 1


def test_a_run_is_admitted_at_its_start_only_with_a_place_free_and_nobody_waiting() -> None:
    organization = factories.org()
    run_admission.limits_set(organization.pk, actor="test", max_running_runs=2)
    first = started(organization)
    assert Run.objects.get(pk=first.pk).admitted_at is not None  # its pick-up: one read
    blocker = started(organization)
    behind = started(organization)
    assert Run.objects.get(pk=behind.pk).admitted_at is None  # no place
    services.run_cancel(run_id=blocker.pk)
    # A place is free, but a run waits for one already: the new run does not jump it.
    late = started(organization)
    assert Run.objects.get(pk=late.pk).admitted_at is None
    assert control.pick_up(behind.pk)
    assert not control.pick_up(late.pk)


@pytest.mark.parametrize("holding", sorted(RUN_STARTED))
def test_a_run_in_any_started_state_holds_its_place_at_a_start(holding: str) -> None:
    # runs.run_admission lists the started states in SQL: the same as runs.states'.
    organization = factories.org()
    run_admission.limits_set(organization.pk, actor="test", max_running_runs=1)
    first = started(organization)
    Run.objects.filter(pk=first.pk).update(status=holding)

    second = services.run_create(organization=organization, plan=factories.plan())
    assert not run_admission.looks_free(second)
    with transaction.atomic():
        assert not run_admission.on_start(second)

    Run.objects.filter(pk=first.pk).update(status="completed")
    assert run_admission.looks_free(second)


def test_waiting_runs_are_admitted_by_priority_then_fifo_as_places_free() -> None:
    organization = factories.org()
    run_admission.limits_set(organization.pk, actor="test", max_running_runs=1)
    first = started(organization)
    assert control.pick_up(first.pk)
    older, newer, urgent = (
        started(organization),
        started(organization),
        started(organization, priority=1),
    )
    for run in (older, newer, urgent):
        assert not control.pick_up(run.pk)

    services.run_cancel(run_id=first.pk)
    assert run_admission.admit_waiting(organization.pk) == [urgent.pk]
    assert control.pick_up(urgent.pk)
    # The one behind it waits for the earlier one, not for a place.
    assert not control.pick_up(newer.pk)
    assert Run.objects.get(pk=newer.pk).queued_reason in (
        "the organization has 1 runs running, its limit (max_running_runs 1)",
    )

    services.run_cancel(run_id=urgent.pk)
    assert run_admission.admit_waiting(organization.pk) == [older.pk]
    assert not control.pick_up(newer.pk)
    assert Run.objects.get(pk=newer.pk).queued_reason == (
        "waiting behind 1 earlier runs of the organization"
    )
    assert control.pick_up(older.pk)
    event = run_history(older).filter(kind=EventKind.QUEUE).order_by("-id").first()
    assert event is not None
    assert event.message == "admitted"


def test_the_sweep_names_each_waiting_organization_once_and_asks_for_its_free_places() -> None:
    organization = factories.org()
    run_admission.limits_set(organization.pk, actor="test", max_running_runs=1)
    runs = [started(organization) for _ in range(4)]
    assert [control.pick_up(run.pk) for run in runs] == [True, False, False, False]
    factories.org()  # an organization with nothing waiting is not named

    assert run_admission.organizations_waiting(100) == [organization.pk]
    services.run_cancel(run_id=runs[0].pk)
    asked = [run_admission.admit_waiting(org) for org in run_admission.organizations_waiting(100)]
    assert asked == [[runs[1].pk]]


def test_a_concurrency_key_is_rendered_from_the_variables_and_limits_its_runs() -> None:
    organization = factories.org()
    a1, b1, a2 = keyed(organization, "a"), keyed(organization, "b"), keyed(organization, "a")

    assert Run.objects.get(pk=a1.pk).concurrency_key == "customer-a"
    assert Run.objects.get(pk=a1.pk).concurrency_max == 1
    assert [control.pick_up(run.pk) for run in (a1, b1, a2)] == [True, True, False]
    assert Run.objects.get(pk=a2.pk).queued_reason == (
        "concurrency key 'customer-a' has 1 runs running, its limit (1)"
    )

    services.run_cancel(run_id=a1.pk)
    assert run_admission.admit_waiting(organization.pk) == [a2.pk]
    assert control.pick_up(a2.pk)


def test_runs_of_a_key_wait_in_order_and_do_not_hold_back_other_runs() -> None:
    organization = factories.org()
    run_admission.limits_set(organization.pk, actor="test", max_running_runs=3)
    a1 = keyed(organization, "a")
    assert control.pick_up(a1.pk)
    a2 = keyed(organization, "a")
    plain = started(organization)

    assert not control.pick_up(a2.pk)
    assert Run.objects.get(pk=a2.pk).queued_reason == (
        "concurrency key 'customer-a' has 1 runs running, its limit (1)"
    )
    # a2, ahead of it, waits on its key: it does not hold the plain run back.
    assert control.pick_up(plain.pk)
    # A key's limit is each run's own: one that allows two runs beside a1.
    a3 = keyed(organization, "a", most=2)
    assert not control.pick_up(a3.pk)
    assert Run.objects.get(pk=a3.pk).queued_reason == (
        "waiting behind 1 earlier runs with concurrency key 'customer-a'"
    )
    services.run_cancel(run_id=a1.pk)
    assert run_admission.admit_waiting(organization.pk) == [a2.pk]


def test_a_concurrency_key_reads_variables_only_and_must_render() -> None:
    organization = factories.org()
    with pytest.raises(PlanInvalid) as refused:
        services.run_create(
            organization=organization,
            plan=factories.plan(concurrency={"key": "${steps.s1.output}"}),
        )
    assert [error.path for error in refused.value.errors] == ["concurrency.key"]
    assert "reads ${variables...} only" in str(refused.value)
    with pytest.raises(PlanInvalid) as missing:
        services.run_create(
            organization=organization,
            plan=factories.plan(concurrency={"key": "${variables.nobody}"}),
        )
    assert [error.path for error in missing.value.errors] == ["concurrency.key"]
    with pytest.raises(PlanInvalid):
        services.run_create(
            organization=organization,
            plan=factories.plan(concurrency={"key": "x", "max_runs": 0}),
        )
    run = services.run_create(
        organization=organization,
        plan=factories.plan(
            variables={"repo": {"owner": "acme", "name": "api"}},
            concurrency={"key": "${variables.repo.owner}/${variables.repo.name}"},
        ),
    )
    assert (run.concurrency_key, run.concurrency_max) == ("acme/api", 1)


def test_a_retried_attempt_waits_for_admission_again() -> None:
    organization = factories.org()
    run_admission.limits_set(organization.pk, actor="test", max_running_runs=1)
    first = started(organization)
    assert control.pick_up(first.pk)
    services.run_fail(run_id=first.pk, code="tool_error", message="failed for the test")
    blocker = started(organization)
    assert control.pick_up(blocker.pk)

    services.run_retry(run_id=first.pk)

    assert Run.objects.get(pk=first.pk).admitted_at is None
    assert not control.pick_up(first.pk)
    assert status(first) == "retrying"


# --------------------------------------------------------------------------- slots
def test_slots_cap_the_steps_executing_and_follow_the_limit_as_it_changes() -> None:
    organization = factories.org()
    run_admission.limits_set(organization.pk, actor="test", max_running_steps=2)
    one = fairness.acquire_slot(organization.pk, "w1")
    two = fairness.acquire_slot(organization.pk, "w2")
    assert one is not None
    assert two is not None
    assert fairness.acquire_slot(organization.pk, "w3") is None
    assert fairness.steps_executing(organization.pk) == 2

    fairness.release_slot(one)
    three = fairness.acquire_slot(organization.pk, "w3")
    assert three is not None
    assert three.slot == one.slot
    # A release by a holder that lost its slot changes nothing.
    fairness.release_slot(one)
    assert fairness.steps_executing(organization.pk) == 2

    run_admission.limits_set(organization.pk, actor="test", max_running_steps=3)
    assert fairness.acquire_slot(organization.pk, "w4") is not None
    assert fairness.acquire_slot(organization.pk, "w5") is None

    # Lowered, the limit lets no new holder in until enough have let go.
    run_admission.limits_set(organization.pk, actor="test", max_running_steps=1)
    assert fairness.acquire_slot(organization.pk, "w6") is None


def test_a_slot_whose_holder_died_is_taken_when_its_lease_passes() -> None:
    organization = factories.org()
    run_admission.limits_set(organization.pk, actor="test", max_running_steps=1)
    dead = fairness.acquire_slot(organization.pk, "dead")
    assert dead is not None
    assert fairness.acquire_slot(organization.pk, "alive") is None

    StepSlot.objects.filter(pk=dead.id).update(expires_at=timezone.now() - timedelta(seconds=1))

    taken = fairness.acquire_slot(organization.pk, "alive")
    assert taken is not None
    assert taken.slot == dead.slot
    assert not fairness.renew_slot(dead)  # the dead holder cannot take it back
    assert fairness.renew_slot(taken)


# --------------------------------------------------------------------------- next run
def running(organization: Organization, *, priority: int = 5, steps: int = 3) -> Run:
    run = started(organization, priority=priority, steps=steps)
    assert control.pick_up(run.pk)
    return run


def test_next_run_serves_the_organization_with_the_fewest_steps_executing_by_share() -> None:
    busy, quiet = factories.org(), factories.org()
    busy_run, quiet_run = running(busy), running(quiet)
    fairness.acquire_slot(busy.pk, "other-worker")

    choice = fairness.next_run(me="me")
    assert choice is not None
    assert choice.run_id == quiet_run.pk
    assert not choice.pickup

    # The asking worker's own slot does not count against the organization it serves.
    mine = fairness.acquire_slot(quiet.pk, "me")
    assert mine is not None
    assert fairness.next_run(me="me").run_id == quiet_run.pk

    # Weighted: two executing with share 3 is less than one with share 1.
    fairness.acquire_slot(quiet.pk, "w2")
    fairness.acquire_slot(quiet.pk, "w3")
    assert fairness.next_run(me="me").run_id == busy_run.pk
    run_admission.limits_set(quiet.pk, actor="test", share=3)
    assert fairness.next_run(me="me").run_id == quiet_run.pk
    # An organization whose slots the worker found all held is left out.
    choice = fairness.next_run(me="me", full=frozenset({quiet.pk}))
    assert choice is not None
    assert choice.run_id == busy_run.pk


def test_organizations_alike_take_turns() -> None:
    organizations = [factories.org() for _ in range(3)]
    runs = {running(organization).pk: organization.pk for organization in organizations}
    turns = []
    for _ in range(6):
        choice = fairness.next_run()
        assert choice is not None
        turns.append(choice.organization_id)
        fairness.served(choice.organization_id)
    assert set(turns[:3]) == set(runs.values())  # each once before any twice
    assert turns[3:] == turns[:3]


def test_within_an_organization_priority_then_fifo_and_pick_ups_too() -> None:
    organization = factories.org()
    older, newer = running(organization), running(organization)
    urgent = running(organization, priority=1)
    waiting = started(organization, priority=0)

    order = []
    skip: set[Any] = set()
    while (choice := fairness.next_run(skip=frozenset(skip))) is not None:
        order.append((choice.run_id, choice.pickup))
        skip.add(choice.run_id)
    assert order == [(waiting.pk, True), (urgent.pk, False), (older.pk, False), (newer.pk, False)]

    # A run waiting for a place is not offered for pick-up.
    Run.objects.filter(pk=waiting.pk).update(queued_reason="the organization is full")
    choice = fairness.next_run()
    assert choice is not None
    assert choice.run_id == urgent.pk


def test_next_run_offers_only_runs_with_a_claimable_step() -> None:
    organization = factories.org()
    run = running(organization, steps=1)
    assert fairness.next_run() is not None
    services.run_pause(run_id=run.pk)
    assert fairness.next_run() is None


def test_the_load_counts_running_queued_pending_and_steps() -> None:
    organization = factories.org()
    run_admission.limits_set(organization.pk, actor="test", max_running_runs=1)
    assert control.pick_up(started(organization).pk)
    assert not control.pick_up(started(organization).pk)
    started(organization)
    fairness.acquire_slot(organization.pk, "w")

    load = fairness.organization_load(organization.pk)
    annotated = fairness.with_load(Organization.objects.filter(pk=organization.pk)).get()

    assert (load.runs_running, load.runs_queued, load.runs_pending, load.steps_executing) == (
        1,
        1,
        2,
        1,
    )
    assert (annotated.runs_running, annotated.runs_queued, annotated.steps_executing) == (  # type: ignore[attr-defined]
        1,
        1,
        1,
    )
