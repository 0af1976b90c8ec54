"""A step's history kept on its row (docs/engine.md, "A step's history").

A step attempt's claim and its plain completion write no event row: each keeps its
event's id (drawn from the events' sequence) on the step's row, and the run's history
(``runs.selectors.run_history``: runs.run_history) lists it exactly as the row would
have been. Any other change that would alter such an event writes it first as a row with
the same id, so that a reader who saw it at that id sees the same event there after. The
golden histories (test_history_golden.py) hold what clients read of whole runs to what
the rows said before.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from decimal import Decimal
from typing import Any

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from common import database_code
from orchestrator.executor import execute_step
from runs import services
from runs.engine.outcomes import Outcome, record
from runs.models import RunEvent, Step
from runs.selectors import run_history
from runs.transitions import claim_step, hand_back_steps
from runs.waits import callbacks
from tests.runs.engine.harness import EngineRun

Start = Callable[..., EngineRun]

# What an event shows, as the API lists it (its id and every field).
SHOWN = (
    "id",
    "attempt_number",
    "entity",
    "entity_id",
    "kind",
    "from_status",
    "to_status",
    "actor",
    "message",
    "payload",
    "created_at",
)


def plan(*names: str, mode: str = "sequential", **step: Any) -> dict[str, Any]:
    steps = [{"name": name, "tool": "noop", **step} for name in names]
    task = {"name": "t", "mode": mode, "max_concurrent_steps": len(names), "steps": steps}
    return {"name": "history", "agents": [{"name": "a", "tasks": [task]}]}


def history(run: Any) -> list[tuple[Any, ...]]:
    return list(run_history(run).values_list(*SHOWN))


def step_events(run: Any, step: Step) -> list[tuple[Any, ...]]:
    return [event for event in history(run) if event[2:4] == ("step", str(step.pk))]


def step_rows(step: Step) -> list[tuple[Any, ...]]:
    rows = RunEvent.objects.filter(entity="step", entity_id=str(step.pk)).order_by("id")
    return list(rows.values_list(*SHOWN))


@pytest.mark.django_db
def test_a_plain_attempts_claim_and_completion_write_no_row_and_are_listed_as_rows_would_be(
    engine_run: Start,
) -> None:
    run = engine_run(plan("one", "two"))
    one = run.finish("one", Outcome(output={}, cost=Decimal("0.0020")))
    two = run.finish("two")

    # Each completion shows its attempt's cost as the recording wrote it.
    for step, cost in ((one, "0.0020"), (two, "0")):
        assert step_rows(step) == []
        claim, completion = step_events(run.run, step)
        assert claim == (
            step.claim_event,
            step.attempt_number,
            "step",
            str(step.pk),
            "transition",
            "pending",
            "running",
            "test",
            "",
            {"attempt": 1},
            step.claimed_at,
        )
        assert completion == (
            step.completion_event,
            step.attempt_number,
            "step",
            str(step.pk),
            "transition",
            "running",
            "completed",
            "system",
            "",
            {"cost": cost},
            step.completed_at,
        )
    # Among the rows, in the order they happened: one's completion released two.
    listed = history(run.run)
    assert [event[0] for event in listed] == sorted(event[0] for event in listed)
    assert [(event[3], event[6]) for event in listed if event[2] == "step"] == [
        (str(one.pk), "running"),
        (str(one.pk), "completed"),
        (str(two.pk), "running"),
        (str(two.pk), "completed"),
    ]


@pytest.mark.django_db
def test_a_completion_on_the_general_path_is_kept_on_its_row_as_the_hot_paths_is(
    engine_run: Start,
) -> None:
    # A borrowed output takes the general path; so does the run's completion after it.
    run = engine_run(plan("one", "two"))
    run.finish("one")
    source = {"step": 1, "attempt": 1}
    two = run.finish(
        "two", Outcome(output={"n": 2}, cost=Decimal("0.0010"), borrowed={"reused_from": source})
    )

    assert two.reused_from == source
    assert [row[4] for row in step_rows(two)] == ["reuse"]  # the completion is no row
    _claim, completion, reuse = step_events(run.run, two)
    assert completion == (
        two.completion_event,
        two.attempt_number,
        "step",
        str(two.pk),
        "transition",
        "running",
        "completed",
        "system",
        "",
        {"cost": "0.0010"},
        two.completed_at,
    )
    assert (reuse[4], reuse[-2]) == ("reuse", {"reused_from": source})
    ended = [event[4:8] for event in history(run.run) if event[2] == "run"][-2:]
    assert ended == [
        ("transition", "running", "completed", "engine"),
        ("charge", "", "", "engine"),
    ]
    assert run.refresh().status == "completed"


def leaves_by_retry(run: EngineRun, step: Step, attempt: int) -> None:
    run.record(step.name, attempt, run.failure("flaky", retryable=True))


def leaves_by_failure(run: EngineRun, step: Step, attempt: int) -> None:
    run.record(step.name, attempt, run.failure("broken"))


def leaves_by_cancel(run: EngineRun, step: Step, attempt: int) -> None:
    with run.committed():
        services.run_cancel(run_id=run.run.pk, actor="test", reason="enough")


@pytest.mark.django_db
@pytest.mark.parametrize(
    "leave", [leaves_by_retry, leaves_by_failure, leaves_by_cancel], ids=lambda f: f.__name__
)
def test_a_claim_stays_on_its_row_and_listed_unchanged_when_its_attempt_leaves_otherwise(
    engine_run: Start, leave: Callable[[EngineRun, Step, int], None]
) -> None:
    run = engine_run(plan("flaky", retry={"max_attempts": 3, "backoff": "fixed", "jitter": 0}))
    attempt = run.claim("flaky")
    step = run.step("flaky")
    (claimed,) = step_events(run.run, step)

    leave(run, step, attempt)

    after = run.step("flaky")
    assert after.claim_event == claimed[0]  # still kept on the row, not written
    listed = step_events(run.run, after)
    assert listed[0] == claimed  # the same event at the same id, the way it left after it
    assert len(listed) > 1
    assert step_rows(after) == listed[1:]
    assert [event[0] for event in listed] == sorted({event[0] for event in listed})


def forgotten_claim(run: EngineRun, step: Step, claimed: tuple[Any, ...]) -> None:
    """The step's claim, forgotten with its worker: written as a row at its id, unchanged,
    and listed once, first, before the way its attempt left."""
    after = run.step(step.name)
    assert (after.claim_event, after.claimed_at, after.worker) == (None, None, "")
    assert step_rows(after)[0] == claimed
    listed = step_events(run.run, after)
    assert listed[0] == claimed
    assert len(listed) > 1
    assert [event[0] for event in listed] == sorted({event[0] for event in listed})


@pytest.mark.django_db
def test_a_claim_handed_back_is_written_as_a_row_at_its_id_unchanged(engine_run: Start) -> None:
    run = engine_run(plan("one"))
    attempt = run.claim("one")
    step = run.step("one")
    (claimed,) = step_events(run.run, step)

    with run.committed():
        assert hand_back_steps(run.run.pk, [(step.pk, attempt)], actor="server") == 1

    forgotten_claim(run, step, claimed)


@pytest.mark.django_db
def test_a_claim_parked_on_a_callback_is_written_as_a_row_at_its_id_unchanged(
    engine_run: Start,
) -> None:
    run = engine_run(plan("hook", tool="callback", params={"timeout": 60}))
    step = run.step("hook")
    claimed_step = claim_step(step.pk, worker="test", task_id="hook", lease_seconds=60)
    assert claimed_step is not None
    (claimed,) = step_events(run.run, step)
    opening = callbacks.new_callback()
    opened = callbacks.open_callback(
        opening, step_id=step.pk, attempt=claimed_step["attempts"], expires_in=60
    )

    with run.committed():
        wait = {"kind": "callback", **opened, "request": None}
        record(step.pk, run.run.pk, claimed_step["attempts"], Outcome(wait=wait))

    forgotten_claim(run, step, claimed)


@pytest.mark.django_db
def test_a_claim_given_back_to_a_timer_is_written_as_a_row_before_the_park(
    engine_run: Start,
) -> None:
    run = engine_run(plan("pause", tool="wait", params={"for": "20s"}))
    step = run.step("pause")

    with run.committed():
        assert execute_step(step.pk, worker="w", task_id="t") == "waiting"

    after = run.step("pause")
    assert (after.claim_event, after.claimed_at, after.worker) == (None, None, "")
    claim, park = step_events(run.run, after)
    assert step_rows(after) == [claim, park]
    assert (claim[5:7], claim[8:10]) == (("pending", "running"), ("", {"attempt": 1}))
    assert claim[7].startswith("w:")  # the worker that claimed, with its process id
    assert park[5:7] == ("running", "pending")


@pytest.mark.django_db
def test_a_retried_steps_attempts_each_keep_their_claim_and_the_last_its_completion(
    engine_run: Start,
) -> None:
    run = engine_run(plan("flaky", retry={"max_attempts": 3, "backoff": "fixed", "jitter": 0}))
    run.fail("flaky", "flaky", retryable=True)
    step = run.finish("flaky")

    listed = step_events(run.run, step)
    assert [(event[5], event[6], event[9].get("attempt")) for event in listed] == [
        ("pending", "running", 1),
        ("running", "pending", 1),
        ("pending", "running", 2),
        ("running", "completed", None),
    ]
    # The first claim was written when the second took its place on the row; the
    # second, and the completion, are kept there.
    assert [event[0] for event in step_rows(step)] == [listed[0][0], listed[1][0]]
    assert step_rows(step)[0] == listed[0]
    assert (step.claim_event, step.completion_event) == (listed[2][0], listed[3][0])


@pytest.mark.django_db
def test_an_update_that_changes_a_kept_claim_in_place_has_it_written_and_forgotten(
    engine_run: Start,
) -> None:
    # No engine path does this (each forgets the claim as it clears the worker): the
    # database's safety net, for one that would.
    run = engine_run(plan("one"))
    run.claim("one")
    step = run.step("one")
    (claimed,) = step_events(run.run, step)

    Step.objects.filter(pk=step.pk).update(worker="someone else")

    after = run.step("one")
    assert (after.claim_event, after.claimed_at) == (None, None)
    assert step_rows(after) == [claimed]
    assert step_events(run.run, after) == [claimed]


# --------------------------------------------------------------------------- upgrade
# The schema before the step's events were kept on its row (runs.0029).
BEFORE = [("runs", "0028_hierarchy_links_unchecked")]


@pytest.fixture
def executor() -> Iterator[MigrationExecutor]:
    executor = MigrationExecutor(connection)
    yield executor
    latest(executor)


def latest(executor: MigrationExecutor) -> None:
    """The latest schema, and its code installed after it, as `migrate` does."""
    executor.loader.build_graph()
    executor.migrate(executor.loader.graph.leaf_nodes())
    database_code.install(connection)


@pytest.mark.django_db(transaction=True)
def test_a_run_in_flight_across_the_upgrade_lists_its_rows_and_its_kept_events_in_order(
    executor: MigrationExecutor, engine_run: Start
) -> None:
    run = engine_run(plan("a", "b", "c", mode="parallel"))
    a = run.finish("a")
    b_attempt = run.claim("b")
    before = history(run.run)

    # Back to the schema of before: every kept event is written as the row it stands
    # for (what the engine of then wrote), and nothing else changes.
    executor.migrate(BEFORE)
    rows = RunEvent.objects.filter(run=run.run).order_by("id").values_list(*SHOWN)
    assert list(rows) == before

    # Up again, the run goes on: b, claimed before, completes after; c runs after.
    latest(executor)
    b = run.record("b", b_attempt)
    c = run.finish("c")

    after = history(run.run)
    assert after[: len(before)] == before
    ids = [event[0] for event in after]
    assert ids == sorted(set(ids))  # in id order, none twice
    assert [event[5:7] for event in step_events(run.run, b)] == [
        ("pending", "running"),
        ("running", "completed"),
    ]
    assert [event[0] for event in step_rows(b)] == [step_events(run.run, b)[0][0]]
    assert b.completion_event == step_events(run.run, b)[1][0]
    assert step_rows(c) == []
    assert len(step_events(run.run, c)) == 2
    assert step_rows(a) == step_events(run.run, a)  # written on the way back
    assert run.refresh().status == "completed"
