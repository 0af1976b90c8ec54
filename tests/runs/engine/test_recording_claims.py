"""A recording that claims its worker's next step writes that step once.

A sequence's next step is released by its predecessor's recording and, when the same
worker goes on to claim it in that recording (``hotpath.complete`` with a ``Claim``), it
is released, dispatched and claimed by one UPDATE: one row version, where a dispatch and
then a claim wrote two. The claim is the claim it was (its lease, its attempt, the
worker's name, the Celery task id, its event after the recording's), and the step is no
one else's to claim. Where the run has a claimable step before it, the claim takes that
one, as it always did, and the released step is dispatched as any other.

Row versions are counted by ``pg_stat_xact_user_tables``: the rows this transaction
updated, per table.
"""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest
from django.db import connection

from runs.engine import hotpath
from runs.engine.outcomes import Outcome, record_and_claim
from runs.selectors import run_history
from runs.transitions import claim_step
from tests.runs.engine.harness import EngineRun

Start = Callable[[dict[str, Any]], EngineRun]


@pytest.fixture
def start(engine_run: Start) -> Start:
    return engine_run


def steps(*names: str) -> list[dict[str, Any]]:
    return [{"name": name, "tool": "noop"} for name in names]


def step_versions_written() -> int:
    """Step rows this transaction has updated so far."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT n_tup_upd FROM pg_stat_xact_user_tables WHERE relname = 'runs_step'")
        return int(cursor.fetchone()[0])


def recorded_with_a_claim(run: EngineRun, name: str, batch: int = 1) -> tuple[hotpath.Next, int]:
    """Claim ``name``, then record it as a worker's recording does (on the hot path),
    claiming the run's next step for the same worker: what it claimed, and the step
    rows it updated."""
    attempt = run.claim(name)
    before = step_versions_written()
    calls: list[bool] = []
    complete = hotpath.complete

    def spy(*args: Any, **kwargs: Any) -> tuple[hotpath.Completed | None, hotpath.Next]:
        done = complete(*args, **kwargs)
        calls.append(done[0] is not None)
        return done

    with run.committed(), pytest.MonkeyPatch.context() as patch:
        patch.setattr(hotpath, "complete", spy)
        applied, after = record_and_claim(
            run.step(name).pk,
            run.run.pk,
            attempt,
            Outcome(output={"from": name}, cost=Decimal("0.002")),
            hotpath.Claim("worker-b", "celery-b", 60, batch=batch),
        )
    assert applied
    assert calls == [True], "the hot path did not record: the test measures nothing"
    return after, step_versions_written() - before


@pytest.mark.parametrize("batch", [1, 4])
def test_a_sequences_next_step_is_dispatched_and_claimed_in_one_row_version(
    start: Start, batch: int
) -> None:
    run = start(
        {
            "name": "seq",
            "agents": [
                {"name": "a", "tasks": [{"name": "t", "steps": steps("one", "two", "three")}]}
            ],
        }
    )

    after, written = recorded_with_a_claim(run, "one", batch)

    # "one" completed, "two" released, dispatched and claimed: two versions, not three.
    assert written == 2
    two = run.step("two")
    assert after.claimed is not None
    assert after.claimed["id"] == two.pk
    assert after.held == ()  # nothing else was claimable: the batch is the one step
    assert (two.status, two.attempts, two.pending_dependencies) == ("running", 1, 0)
    assert (two.worker, two.celery_task_id) == ("worker-b", "celery-b")
    assert two.dispatched_at is not None
    assert two.dispatched_at == two.status_changed_at
    assert two.lease_expires_at is not None
    assert two.started_at == two.dispatched_at
    assert run.step("three").dispatched_at is None
    last = list(run_history(run.run))[-2:]
    assert [(e.entity_id, e.from_status, e.to_status, e.actor) for e in last] == [
        (str(run.step("one").pk), "running", "completed", "system"),
        (str(two.pk), "pending", "running", "worker-b"),
    ]
    assert last[-1].payload == {"attempt": 1}
    # Its doorbell is rung as before (the worker that holds it has it already), and
    # nobody else can claim it.
    assert run.sent() == ["one", "two"]
    assert claim_step(two.pk, worker="other", task_id="x", lease_seconds=60) is None


def test_a_tasks_next_task_starts_with_its_first_step_claimed_in_one_row_version(
    start: Start,
) -> None:
    run = start(
        {
            "name": "tasks",
            "agents": [
                {
                    "name": "a",
                    "tasks": [
                        {"name": "first", "steps": steps("one")},
                        {"name": "second", "steps": steps("two", "three")},
                    ],
                }
            ],
        }
    )

    after, written = recorded_with_a_claim(run, "one")

    assert written == 2  # "one" completed; "two" dispatched and claimed
    two = run.step("two")
    assert after.claimed is not None
    assert after.claimed["id"] == two.pk
    assert (two.status, two.worker, two.dispatched_at) == ("running", "worker-b", two.started_at)


def test_a_claimable_step_before_the_released_one_is_claimed_first_as_always(
    start: Start,
) -> None:
    run = start(
        {
            "name": "two tasks",
            "agents": [
                {
                    "name": "a",
                    "mode": "parallel",
                    "tasks": [
                        {"name": "left", "steps": steps("waiting")},
                        {"name": "right", "steps": steps("one", "two")},
                    ],
                }
            ],
        }
    )

    after, written = recorded_with_a_claim(run, "one")

    # "waiting" was dispatched at the start and comes first: the claim takes it, and
    # "two" is dispatched for whoever claims it next.
    assert written == 3
    assert after.claimed is not None
    assert after.claimed["id"] == run.step("waiting").pk
    two = run.step("two")
    assert (two.status, two.pending_dependencies, two.attempts) == ("pending", 0, 0)
    assert two.dispatched_at is not None
    assert claim_step(two.pk, worker="other", task_id="x", lease_seconds=60) is not None
