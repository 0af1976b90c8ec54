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

from typing import Any

import pytest

from common.invariants import check_all
from runs import services
from runs.engine import control
from runs.engine.start import run_start
from runs.models import Run, Step, Task
from runs.transitions import claim_step
from tests import factories
from tests.factories import step
from tests.runs.test_races import race

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
    assert {name: found for name, found in check_all().items() if found} == {}


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
