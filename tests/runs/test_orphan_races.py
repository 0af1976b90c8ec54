"""Control operations racing recordings leave no row whose parent is missing.

The links of the rows a run and its steps write are foreign keys the database does not
check (docs/engine.md, "Links the database does not check"): each row is written from
its parent's row, and no parent is deleted. Here the writers of new parents (a retry's
next attempt with its agents, tasks, steps and reservation; a start's attempt) and of
children (a recording's events, charge and claim; a cancel's settlement) race each
other from two processes; ``runs.orphans`` and ``billing.orphans`` must find nothing,
nor any other invariant.
"""

from __future__ import annotations

from typing import Any

import pytest

from common.invariants import check_all, violations
from runs import services
from runs.engine import control
from runs.models import Run, RunAttempt
from tests import factories
from tests.factories import step
from tests.runs.test_hotpath_races import one_task, running, wide
from tests.runs.test_races import race

pytestmark = pytest.mark.django_db(transaction=True)

ROUNDS = 30

SPECS = {
    # Leaves of a task whose steps all run at once: the recording's leaf shape.
    "leaves": wide(steps=2),
    # A sequence: the recording dispatches the next step and claims it.
    "sequence": one_task(step("a"), step("b"), step("c")),
}


def assert_no_orphan() -> None:
    assert check_all("runs.orphans", "billing.orphans") == {
        "runs.orphans": [],
        "billing.orphans": [],
    }
    assert violations() == {}


@pytest.mark.parametrize("spec", SPECS.values(), ids=SPECS.keys())
@pytest.mark.parametrize("operation", ["cancel", "pause", "fail_and_retry"])
def test_a_control_racing_a_recording_leaves_no_orphan(
    spec: dict[str, Any], operation: str
) -> None:
    run_ids = running(spec, "a", rounds=ROUNDS)

    outcomes = race("record_a_claiming", operation, run_ids)

    assert len(outcomes["record_a_claiming"]) == ROUNDS
    if operation == "fail_and_retry":
        # Every run went on to its second attempt, whichever came first. A pick-up that
        # met the recording's lock on the run left it to the lost-message sweep: here,
        # the test sends it again.
        assert RunAttempt.objects.filter(run_id__in=run_ids, attempt_number=2).count() == ROUNDS
        for run_id in Run.objects.filter(pk__in=run_ids, status="retrying").values_list(
            "pk", flat=True
        ):
            assert control.pick_up(run_id), run_id
        assert set(Run.objects.filter(pk__in=run_ids).values_list("status", flat=True)) == {
            "running"
        }
    assert_no_orphan()


def test_a_resume_racing_a_recording_leaves_no_orphan() -> None:
    run_ids = running(SPECS["sequence"], "a", rounds=ROUNDS)
    for run_id in run_ids:
        services.run_pause(run_id=run_id, actor="test")

    race("record_a_claiming", "resume", run_ids)

    assert set(Run.objects.filter(pk__in=run_ids).values_list("status", flat=True)) == {"running"}
    assert_no_orphan()


def test_a_delete_racing_a_start_leaves_one_of_them_and_no_orphan() -> None:
    organization = factories.org(credits=100_000)
    run_ids = [
        str(services.run_create(organization=organization, plan=SPECS["sequence"]).pk)
        for _ in range(ROUNDS)
    ]

    outcomes = race("start", "delete", run_ids)

    for index, run_id in enumerate(run_ids):
        said = sorted([outcomes["start"][index], outcomes["delete"][index]])
        assert said == ["refused", "won"], run_id
        run = Run.objects.get(pk=run_id)
        started = outcomes["start"][index] == "won"
        assert (run.status != "cancelled", run.deleted_at is None) == (started, started), run_id
        assert RunAttempt.objects.filter(run_id=run_id).count() == int(started), run_id
    assert_no_orphan()
