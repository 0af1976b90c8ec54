"""Recordings of one run's steps overlap: what the run's lock guarded still holds.

The hot path's function takes the run's gate shared (recordings of one run go on side
by side) and, in order, the row of each level whose counters it changes: the task's,
then the agent's when the task ends, then the run's when the agent ends
(docs/engine.md, "Locks"). Two processes record two steps of a run at the same moment,
a hundred runs over: each level's counters must see both, exactly one of them must
start what both released, and a control action racing a recording must find it either
done or not begun. A version that shared the gate without taking those row locks
loses one of two releases (a join never dispatched, a task never completed) or starts
the same work twice; one that let a recording under way meet a cancel charges after the
settlement.
"""

from __future__ import annotations

import threading
from decimal import Decimal
from typing import Any

import pytest
from django.db import connection, connections, transaction

from billing.models import Reservation
from common.invariants import violations
from runs import services
from runs.engine import control, hotpath
from runs.engine.outcomes import Outcome, record_and_claim
from runs.engine.start import run_start
from runs.models import Run, Step, Task
from runs.selectors import run_history
from runs.transitions import claim_step, hand_back_steps
from tests import factories
from tests.factories import step
from tests.runs.test_races import race
from tests.support import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

ROUNDS = 100


def running(spec: dict[str, Any], *claimed: str, rounds: int = ROUNDS) -> list[str]:
    """``rounds`` runs of ``spec`` picked up, with the steps named ``claimed`` claimed
    (running, attempt 1) as workers would have them when their results come in."""
    organization = factories.org(credits=100_000)
    ids = []
    for _ in range(rounds):
        run = services.run_create(organization=organization, plan=spec, actor="test")
        run_start(run_id=run.pk)
        assert control.pick_up(run.pk)
        for name in claimed:
            step_id = Step.objects.get(run=run, name=name).pk
            assert claim_step(step_id, worker="w", task_id=name, lease_seconds=600) is not None
        ids.append(str(run.pk))
    return ids


def one_task(*steps: dict[str, Any], **task: Any) -> dict[str, Any]:
    return {
        "name": "race",
        "agents": [{"name": "g", "tasks": [{"name": "t", "steps": list(steps), **task}]}],
    }


def fan_then_after() -> dict[str, Any]:
    """A parallel task of two steps, a and b, then a task of one step, next."""
    return {
        "name": "race",
        "agents": [
            {
                "name": "g",
                "tasks": [
                    {"name": "fan", "mode": "parallel", "steps": [step("a"), step("b")]},
                    {"name": "after", "steps": [step("next")]},
                ],
            }
        ],
    }


def statuses(run_id: str) -> dict[str, str]:
    return dict(Step.objects.filter(run_id=run_id).values_list("name", "status"))


def assert_consistent() -> None:
    assert violations() == {}


def test_two_dependencies_ending_together_release_their_join_once() -> None:
    spec = one_task(
        step("a"), step("b"), step("join", depends_on=["a", "b"]), step("other"), mode="dag"
    )
    run_ids = running(spec, "a", "b")

    outcomes = race("record_a", "record_b", run_ids)

    assert set(outcomes["record_a"]) == set(outcomes["record_b"]) == {"won"}
    for run_id in run_ids:
        join = Step.objects.get(run_id=run_id, name="join")
        assert (join.status, join.pending_dependencies) == ("pending", 0), run_id
        assert join.dispatched_at is not None, f"{run_id}: the join was never dispatched"
        task = Task.objects.get(run_id=run_id)
        # a and b done; join and other open (other was dispatched at the start).
        assert (task.open_children, task.active_children) == (2, 2), run_id
    assert_consistent()


def test_a_tasks_last_two_steps_ending_together_complete_it_once() -> None:
    spec = fan_then_after()
    run_ids = running(spec, "a", "b")

    race("record_a", "record_b", run_ids)

    for run_id in run_ids:
        tasks = {t.name: t for t in Task.objects.filter(run_id=run_id)}
        assert tasks["fan"].status == "completed", f"{run_id}: the task never completed"
        assert (tasks["fan"].open_children, tasks["fan"].active_children) == (0, 0)
        assert tasks["after"].status == "running", run_id
        assert Step.objects.get(run_id=run_id, name="next").dispatched_at is not None
    assert_consistent()


def test_leaves_of_a_wide_task_ending_together_each_count_off_and_claim_once() -> None:
    # Leaves of a task whose steps all run at once are recorded, and the next steps
    # claimed, before the task's row is locked; that lock, taken last, must still count
    # off both, and the claims (taken without it) must take different steps.
    spec = one_task(*(step(name) for name in "abcd"), mode="parallel")
    run_ids = running(spec, "a", "b")

    outcomes = race("record_a_claiming", "record_b_claiming", run_ids)

    assert set(outcomes["record_a_claiming"]) == set(outcomes["record_b_claiming"]) == {"won"}
    for run_id in run_ids:
        task = Task.objects.get(run_id=run_id)
        assert (task.status, task.open_children, task.active_children) == ("running", 2, 2)
        found = {s.name: (s.status, s.worker) for s in Step.objects.filter(run_id=run_id)}
        assert found["a"][0] == found["b"][0] == "completed", (run_id, found)
        # c and d claimed, one by each worker (which one is the race's).
        assert {found["c"], found["d"]} == {("running", "w-a"), ("running", "w-b")}, found
    assert_consistent()


def test_a_wide_tasks_last_two_leaves_ending_together_complete_it_once() -> None:
    # Both leaves try the leaf's way; the one that finds its task's last child open
    # there rolls it back and completes the task the general way, claiming the next
    # task's step.
    spec = fan_then_after()
    run_ids = running(spec, "a", "b")

    race("record_a_claiming", "record_b_claiming", run_ids)

    for run_id in run_ids:
        tasks = {t.name: t for t in Task.objects.filter(run_id=run_id)}
        assert tasks["fan"].status == "completed", f"{run_id}: the task never completed"
        assert (tasks["fan"].open_children, tasks["fan"].active_children) == (0, 0)
        after = Step.objects.get(run_id=run_id, name="next")
        assert (after.status, after.attempts) == ("running", 1), run_id
    assert_consistent()


def test_two_tasks_of_a_dag_ending_together_start_their_dependent_once() -> None:
    spec = {
        "name": "race",
        "agents": [
            {
                "name": "g",
                "mode": "dag",
                "tasks": [
                    {"name": "ta", "steps": [step("a")]},
                    {"name": "tb", "steps": [step("b")]},
                    {"name": "tc", "depends_on": ["ta", "tb"], "steps": [step("c")]},
                    {"name": "td", "steps": [step("d")]},
                ],
            }
        ],
    }
    run_ids = running(spec, "a", "b")

    race("record_a", "record_b", run_ids)

    for run_id in run_ids:
        tasks = {t.name: t for t in Task.objects.filter(run_id=run_id)}
        assert tasks["tc"].status == "running", f"{run_id}: the dependent never started"
        assert tasks["tc"].pending_dependencies == 0
        c = Step.objects.get(run_id=run_id, name="c")
        assert c.dispatched_at is not None, run_id
        assert c.status == "pending", run_id
        agent = tasks["tc"].agent
        agent.refresh_from_db()
        # ta and tb done; tc and td open and running.
        assert (agent.open_children, agent.active_children) == (2, 2), run_id
    assert_consistent()


def test_a_cancel_racing_a_recording_finds_it_done_or_not_begun() -> None:
    spec = one_task(step("a"), step("b"), step("c"), mode="parallel")
    run_ids = running(spec, "a")

    race("record_a", "cancel", run_ids)

    for run_id in run_ids:
        run = Run.objects.get(pk=run_id)
        assert run.status == "cancelled", run_id
        a = Step.objects.get(run_id=run_id, name="a")
        # Recorded before the cancel (completed and charged) or after (dropped).
        assert a.status in ("completed", "cancelled"), run_id
        assert (a.output is not None) == (a.status == "completed"), run_id
    # Credit conservation: nothing charged after the run's reservation was settled.
    assert_consistent()


@pytest.mark.parametrize("other", ["record_a_again", "record_a_failed"])
def test_two_recordings_of_one_attempt_at_once_record_and_charge_it_once(other: str) -> None:
    """A duplicate delivery (or a second worker's report of the same claim) meets the
    first: the step's row, found running this attempt, admits one of them; the other
    finds it recorded and charges nothing (the charge is drawn on the reservation in the
    recording's transaction: no ledger key stands behind it)."""
    spec = one_task(step("a"), step("b"), step("c"), mode="parallel")
    run_ids = running(spec, "a")

    outcomes = race("record_a", other, run_ids)

    for index, run_id in enumerate(run_ids):
        sides = [outcomes["record_a"][index], outcomes[other][index]]
        assert sorted(sides) == ["refused", "won"], run_id
        won = "record_a" if sides[0] == "won" else other
        a = Step.objects.get(run_id=run_id, name="a")
        assert a.status == ("pending" if won == "record_a_failed" else "completed"), run_id
        assert a.cost == Decimal("0.01"), run_id
        assert Reservation.objects.get(run_id=run_id).charged == Decimal("0.01"), run_id
        finished = run_history(run_id).filter(
            entity="step", entity_id=str(a.pk), from_status="running"
        )
        assert finished.count() == 1, run_id
    assert_consistent()


def test_a_pause_racing_a_recording_leaves_nothing_dispatched_to_run() -> None:
    spec = one_task(step("a"), step("next", depends_on=["a"]), step("b"), mode="dag")
    run_ids = running(spec, "a")

    race("record_a", "pause", run_ids)

    for run_id in run_ids:
        assert Run.objects.get(pk=run_id).status == "paused", run_id
        found = statuses(run_id)
        assert found["a"] in ("completed", "running"), run_id
        # What the recording released is paused with the rest, never left claimable.
        assert found["next"] == "paused" or found["a"] == "running", (run_id, found)
        assert found["b"] == "paused", (run_id, found)
    assert_consistent()


# --------------------------------------------------------------------------- batches
# A server whose last step was short claims up to ENGINE_CLAIM_BATCH of its run's next
# steps with the recording and runs them in turn; those it will not start it hands back
# (docs/engine.md, "Batches").
def wide(steps: int = 12) -> dict[str, Any]:
    """One task of a, b and ``steps`` more, all running at once (leaves)."""
    names = ["a", "b", *(f"s{i}" for i in range(steps))]
    return one_task(*(step(name) for name in names), mode="parallel", max_concurrent_steps=100)


def holding_a_batch_of(spec: dict[str, Any], rounds: int = ROUNDS) -> list[str]:
    """Runs of ``spec`` in which the worker "held" recorded step a and claimed a batch
    with it (four steps: the one it starts next and three it holds), none started."""
    run_ids = running(spec, "a", rounds=rounds)
    for run_id in run_ids:
        a = Step.objects.get(run_id=run_id, name="a")
        claim = hotpath.Claim("held", "bell-held", 600, batch=4)
        outcome = Outcome({"by": "a"}, Decimal("0.01"))
        applied, after = record_and_claim(a.pk, run_id, a.attempts, outcome, claim)
        assert applied, run_id
        assert after.claimed is not None, run_id
        assert len(after.held) == 3, run_id
    return run_ids


def test_two_batches_claimed_at_once_never_share_a_step() -> None:
    # Each recording claims up to four of the run's next steps, skipping those the other
    # is claiming: every step is claimed once at most, by one of them.
    run_ids = running(wide(), "a", "b")

    outcomes = race("record_a_batch", "record_b_batch", run_ids)

    assert set(outcomes["record_a_batch"]) == set(outcomes["record_b_batch"]) == {"won"}
    for run_id in run_ids:
        steps = Step.objects.filter(run_id=run_id).exclude(name__in=["a", "b"])
        claimed = {s.name: s.worker for s in steps if s.status == "running"}
        assert all(s.attempts == (s.status == "running") for s in steps), run_id
        assert {"w-a", "w-b"} == set(claimed.values()), (run_id, claimed)
        assert 2 <= len(claimed) <= 8, (run_id, claimed)
        claims = run_history(run_id).filter(entity="step", to_status="running")
        assert claims.count() == len(claimed) + 2, run_id  # and a's and b's own
    assert_consistent()


def test_a_batch_handed_back_racing_a_pause_ends_paused_never_claimable() -> None:
    # The hand-back takes the run's gate shared: before the pause, its steps go back to
    # PENDING and the pause pauses them; after it, they go straight to PAUSED. A
    # hand-back that read the run RUNNING while the pause committed would leave them
    # PENDING in a paused run, for a resume to find claimable twice over.
    run_ids = holding_a_batch_of(wide())

    race("hand_back", "pause", run_ids)

    for run_id in run_ids:
        assert Run.objects.get(pk=run_id).status == "paused", run_id
        steps = Step.objects.filter(run_id=run_id).exclude(name="a")
        # The four handed back as the others: paused, their attempt taken back.
        found = {(s.status, s.attempts, s.worker, s.started_at) for s in steps}
        assert found == {("paused", 0, "", None)}, (run_id, found)
    assert_consistent()


def test_a_batch_handed_back_racing_a_cancel_stays_cancelled() -> None:
    run_ids = holding_a_batch_of(wide())

    race("hand_back", "cancel", run_ids)

    for run_id in run_ids:
        assert Run.objects.get(pk=run_id).status == "cancelled", run_id
        found = dict(Step.objects.filter(run_id=run_id).values_list("name", "status"))
        assert found.pop("a") == "completed", run_id
        assert set(found.values()) == {"cancelled"}, (run_id, found)
    assert_consistent()


def test_a_hand_back_waits_for_a_pause_under_way_and_pauses_its_steps() -> None:
    # The race above, in its narrowest order: the hand-back comes while the pause's
    # transaction has moved the run's pending steps and not yet committed. It must wait
    # for the pause (the gate) and then find the run paused; one that read the run
    # RUNNING there would put its steps back PENDING after the pause had looked.
    (run_id,) = holding_a_batch_of(wide(), rounds=1)
    held = list(Step.objects.filter(run_id=run_id, worker="held").values_list("pk", "attempts"))
    handed: list[int] = []

    def hand_back() -> None:
        try:
            handed.append(hand_back_steps(run_id, held, actor="held"))
        finally:
            connections.close_all()

    with transaction.atomic():
        services.run_pause(run_id=run_id, actor="test")
        other = threading.Thread(target=hand_back)
        other.start()
        wait_until(
            lambda: not other.is_alive() or waiting_for_a_lock(),
            timeout=30,
            what="the hand-back to wait for the pause or to end",
        )
    other.join(30)

    assert handed == [0]  # nothing made claimable: the run was paused
    found = {(s.status, s.attempts) for s in Step.objects.filter(run_id=run_id).exclude(name="a")}
    assert found == {("paused", 0)}
    assert_consistent()


def waiting_for_a_lock() -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_locks WHERE NOT granted")
        return bool(cursor.fetchone()[0])
