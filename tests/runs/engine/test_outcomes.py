"""The engine's decisions, in process: outcomes fed to the recording path, no worker.

Each test starts a run, lets the engine dispatch, and plays the worker: it claims the
steps the engine sent and records the outcome it chooses. The integration tests
(tests/integration/test_engine_*.py) show the same behaviours end to end on a real
worker; these pin every branch down in milliseconds.
"""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest

from billing.models import LedgerEntry, Reservation
from common.invariants import violations
from common.tools.base import ToolError
from runs import services
from runs.engine.outcomes import Outcome, record
from runs.models import Agent, RunAttempt, Step, Task
from runs.outbox import RunMessage
from runs.people import approvals
from runs.selectors import run_history
from runs.transitions import claim_step
from tests.runs.engine.harness import EngineRun

Start = Callable[[dict[str, Any]], EngineRun]


def step(name: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "tool": "noop", **extra}


def plan(*steps: dict[str, Any], task: dict[str, Any] | None = None, **run: Any) -> dict[str, Any]:
    """One agent with one task of ``steps`` (sequential unless ``task`` says otherwise)."""
    return {
        "name": "engine",
        "agents": [{"name": "a", "tasks": [{"name": "t", "steps": list(steps), **(task or {})}]}],
        **run,
    }


@pytest.fixture
def start(engine_run: Start) -> Start:
    return engine_run


def assert_invariants_hold() -> None:
    assert violations() == {}


# --------------------------------------------------------------------------- success
def test_a_sequential_task_sends_each_step_only_after_the_one_before(start: Start) -> None:
    run = start(plan(step("one"), step("two"), step("three")))
    assert run.sent() == ["one"]

    run.finish("one", Outcome(output={"n": 1}))
    assert run.sent() == ["one", "two"]
    run.finish("two")
    run.finish("three")

    assert run.refresh().status == "completed"
    assert run.step("one").output == {"n": 1}
    assert run.sent() == ["one", "two", "three"]
    assert_invariants_hold()


def test_a_parallel_task_sends_up_to_its_limit_and_refills_as_steps_finish(start: Start) -> None:
    names = [f"s{i}" for i in range(5)]
    run = start(plan(*map(step, names), task={"mode": "parallel", "max_concurrent_steps": 2}))
    assert run.sent() == ["s0", "s1"]

    run.finish("s1")
    assert run.sent() == ["s0", "s1", "s2"]
    for name in ["s0", "s2", "s3", "s4"]:
        run.finish(name)

    assert run.refresh().status == "completed"
    assert_invariants_hold()


def test_an_approval_started_beside_other_work_leaves_that_work_sent_and_the_run_running(
    start: Start,
) -> None:
    # Two tasks start together, the first's step an approval: the second's step is sent
    # too (the run does not stop to wait halfway through the dispatch), and the run waits
    # for nothing while it runs.
    tasks = [
        {"name": "ask", "steps": [{"name": "review", "tool": "approval"}]},
        {"name": "work", "steps": [step("build")]},
    ]
    run = start({"name": "engine", "agents": [{"name": "a", "mode": "parallel", "tasks": tasks}]})
    assert run.sent() == ["build"]
    assert run.step("review").status == "waiting_approval"
    assert run.refresh().status == "running"

    run.finish("build")
    assert run.refresh().status == "waiting_approval"
    approvals.run_approve(run_id=run.run.pk, actor="ops")
    assert run.refresh().status == "completed"
    assert_invariants_hold()


def test_each_attempt_is_charged_on_the_reservation_and_the_ledger_gets_one_charge_at_the_end(
    start: Start,
) -> None:
    run = start(plan(step("one"), step("two")))
    reserved = Reservation.objects.get(run_id=run.run.pk).reserved
    first, second = (reserved / 4).quantize(Decimal("0.000001")), Decimal("0.000001")
    charges = LedgerEntry.objects.filter(type="charge", run_id=run.run.pk)

    run.finish("one", Outcome(output={}, cost=first))

    # The run's spend shows while it runs: on its reservation, the step's on its row.
    assert Reservation.objects.get(run_id=run.run.pk).charged == first
    assert run.step("one").cost == first
    assert not charges.exists()
    assert_invariants_hold()

    run.finish("two", Outcome(output={}, cost=second))

    attempt = RunAttempt.objects.get(run=run.run)
    assert list(charges.values_list("amount", "idempotency_key")) == [
        (first + second, f"charge:{attempt.pk}")
    ]
    assert not charges.filter(step__isnull=False).exists()
    reservation = Reservation.objects.get(run_id=run.run.pk)
    assert (reservation.charged, reservation.refunded) == (
        first + second,
        reserved - first - second,
    )
    assert reservation.settled_at is not None
    assert_invariants_hold()


def test_a_duplicate_recording_of_an_attempt_charges_nothing_more(start: Start) -> None:
    run = start(plan(step("flaky", retry={"max_attempts": 3, "base_delay_ms": 0})))
    flaky = run.step("flaky")
    failed = run.failure("timeout", retryable=True)
    run.finish("flaky", failed)  # attempt 1: charged, retried (the general path)

    record(flaky.pk, run.run.pk, 1, failed)  # attempt 1 again, its step pending
    attempt = run.claim("flaky")
    record(flaky.pk, run.run.pk, 1, failed)  # attempt 1 again, attempt 2 running
    run.record("flaky", attempt, Outcome(output={}, cost=Decimal("0.01")))
    record(flaky.pk, run.run.pk, attempt, Outcome(output={}, cost=Decimal(1)))  # 2 again

    done = run.step("flaky")
    assert (done.status, done.attempts, done.failures, done.cost) == (
        "completed",
        2,
        1,
        Decimal("0.02"),
    )
    # One charge per attempt: on the reservation, then in the ledger's one entry.
    assert Reservation.objects.get(run_id=run.run.pk).charged == Decimal("0.02")
    charges = LedgerEntry.objects.filter(type="charge", run_id=run.run.pk)
    assert [entry.amount for entry in charges] == [Decimal("0.02")]
    assert_invariants_hold()


def test_a_skipped_outcome_counts_as_finished(start: Start) -> None:
    run = start(plan(step("maybe"), step("after")))
    run.finish("maybe", Outcome(skipped=True))
    run.finish("after")

    assert run.statuses() == {"maybe": "skipped", "after": "completed"}
    assert run.refresh().status == "completed"


# --------------------------------------------------------------------------- retries
def test_a_retryable_failure_is_sent_again_after_its_backoff(start: Start) -> None:
    retry = {"max_attempts": 3, "backoff": "fixed", "base_delay_ms": 1500, "jitter": 0}
    run = start(plan(step("flaky", retry=retry)))

    failed = run.fail("flaky", "rate_limited", retryable=True)

    assert (failed.status, failed.failures, failed.error["code"]) == (
        "pending",
        1,
        "rate_limited",
    )
    assert failed.next_run_at is not None
    resent = run.transport.steps[-1]
    assert (resent.step_id, resent.countdown_s) == (failed.pk, 1.5)
    run.finish("flaky")
    assert run.refresh().status == "completed"
    assert_invariants_hold()


def test_retries_end_with_the_attempt_budget_and_fail_the_run(start: Start) -> None:
    run = start(plan(step("flaky", retry={"max_attempts": 2, "base_delay_ms": 0})))
    run.fail("flaky", "timeout", retryable=True)
    failed = run.fail("flaky", "timeout", retryable=True)

    assert failed.status == "failed"
    assert failed.error["code"] == "attempt_budget_exhausted"
    assert failed.error["cause"] == "timeout"
    assert run.refresh().status == "failed"
    assert run.run.last_error["code"] == "attempt_budget_exhausted"
    assert_invariants_hold()


def test_a_failure_that_is_not_retryable_is_never_retried(start: Start) -> None:
    run = start(plan(step("bad", retry={"max_attempts": 5}), step("never")))
    failed = run.fail("bad", "invalid_input", retryable=False)

    assert (failed.status, failed.attempts) == ("failed", 1)
    assert run.statuses() == {"bad": "failed", "never": "cancelled"}
    assert run.sent() == ["bad"]


def test_a_charge_beyond_the_reservation_fails_the_step_with_budget_exhausted(
    start: Start,
) -> None:
    run = start(plan(step("costly"), step("after")))
    reserved = Reservation.objects.get(run_id=run.run.pk).reserved

    failed = run.finish("costly", Outcome(output={}, cost=reserved + 1))

    assert failed.status == "failed"
    assert failed.error["code"] == "budget_exhausted"
    assert failed.cost == Decimal(0)
    assert Reservation.objects.get(run_id=run.run.pk).charged == Decimal(0)
    assert not LedgerEntry.objects.filter(type="charge", run_id=run.run.pk).exists()
    assert run.refresh().status == "failed"
    assert_invariants_hold()


# --------------------------------------------------------------------------- failure modes
def test_fail_fast_cancels_the_rest_and_fails_every_level_up(start: Start) -> None:
    run = start(plan(step("ok"), step("boom"), step("never")))
    run.finish("ok")
    run.fail("boom")

    assert run.statuses() == {"ok": "completed", "boom": "failed", "never": "cancelled"}
    assert Task.objects.get(run=run.run).status == "failed"
    assert Agent.objects.get(run=run.run).status == "failed"
    assert run.refresh().status == "failed"
    assert RunAttempt.objects.get(run=run.run).outcome == "failed"
    assert_invariants_hold()


def test_continue_skips_the_failed_step_and_carries_on(start: Start) -> None:
    run = start(plan(step("boom"), step("after"), task={"failure_mode": "continue"}))
    run.fail("boom", "not_found")
    run.finish("after")

    assert run.statuses() == {"boom": "skipped", "after": "completed"}
    assert run.step("boom").error["code"] == "not_found"  # kept for the reader
    assert run.refresh().status == "completed"
    assert_invariants_hold()


def test_a_task_that_retries_starts_a_new_generation_of_its_steps(start: Start) -> None:
    run = start(plan(step("ok"), step("boom"), task={"failure_mode": "retry"}))
    run.finish("ok")
    run.fail("boom")

    task = Task.objects.get(run=run.run)
    assert (task.status, task.retry_count) == ("running", 1)
    assert Step.objects.filter(run=run.run, name="ok").count() == 2
    assert run_history(run.run).filter(kind="retry", entity="task").count() == 1
    run.finish("ok")
    run.finish("boom")
    assert run.refresh().status == "completed"
    assert_invariants_hold()


def test_a_task_retries_at_most_three_times_then_fails(start: Start) -> None:
    run = start(plan(step("boom"), task={"failure_mode": "retry"}))
    for _ in range(4):
        run.fail("boom")

    task = Task.objects.get(run=run.run)
    assert (task.status, task.retry_count) == ("failed", 3)
    assert run.refresh().status == "failed"


def test_a_run_that_retries_is_queued_for_a_new_attempt(start: Start) -> None:
    run = start(plan(step("boom"), failure_mode="retry", max_attempts=2))
    run.fail("boom")

    assert run.refresh().status == "retrying"
    assert run.run.automatic_retries == 1
    assert run.transport.runs[-1] == (RunMessage.PICK_UP, str(run.run.pk))
    assert_invariants_hold()


# --------------------------------------------------------------------------- dags
def test_a_dag_skips_what_depends_on_a_failure_transitively(start: Start) -> None:
    steps = [
        step("fetch"),
        step("parse", depends_on=["fetch"]),
        step("store", depends_on=["parse"]),
        step("audit"),
    ]
    run = start(plan(*steps, task={"mode": "dag", "failure_mode": "continue"}))
    assert sorted(run.sent()) == ["audit", "fetch"]

    run.fail("fetch")
    run.finish("audit")

    assert run.statuses() == {
        "fetch": "skipped",
        "parse": "skipped",
        "store": "skipped",
        "audit": "completed",
    }
    assert run.step("store").error["code"] == "dependency_failed"
    assert run.refresh().status == "completed"
    assert_invariants_hold()


def test_a_dag_sends_a_join_once_all_its_dependencies_completed(start: Start) -> None:
    steps = [step("left"), step("right"), step("join", depends_on=["left", "right"])]
    run = start(plan(*steps, task={"mode": "dag"}))

    run.finish("left")
    assert "join" not in run.sent()
    run.finish("right")
    assert run.sent()[-1] == "join"


# --------------------------------------------------------------------------- handlers
def test_a_handler_that_completes_handles_the_failure(start: Start) -> None:
    run = start(plan(step("boom", on_error=[step("notify")]), step("after")))
    run.fail("boom", "not_found")
    assert run.sent()[-1] == "boom.on_error.notify"

    run.finish("boom.on_error.notify")
    run.finish("after")

    assert run.step("boom").handled is True
    assert run.statuses()["after"] == "completed"
    assert run.refresh().status == "completed"
    assert_invariants_hold()


def test_a_handler_that_fails_propagates_the_original_failure(start: Start) -> None:
    handlers = [step("notify"), step("page")]
    run = start(plan(step("boom", on_error=handlers), step("after")))
    run.fail("boom", "not_found")
    run.fail("boom.on_error.notify")

    statuses = run.statuses()
    assert statuses["boom.on_error.page"] == "skipped"
    assert statuses["after"] == "cancelled"
    assert run.refresh().status == "failed"
    assert run.run.last_error["code"] == "not_found"
    assert_invariants_hold()


# --------------------------------------------------------------------------- late results
def test_a_result_for_a_step_no_longer_running_is_dropped(start: Start) -> None:
    run = start(plan(step("slow")))
    slow = run.step("slow")

    claimed = claim_step(slow.pk, worker="test", task_id="t", lease_seconds=60)
    assert claimed is not None
    services.run_cancel(run_id=run.run.pk, reason="stop")
    record(slow.pk, run.run.pk, claimed["attempts"], Outcome(output={"late": True}))

    dropped = Step.objects.get(pk=slow.pk)
    assert (dropped.status, dropped.output, dropped.cost) == ("cancelled", None, Decimal(0))
    assert Reservation.objects.get(run_id=run.run.pk).charged == Decimal(0)
    assert not LedgerEntry.objects.filter(type="charge", run_id=run.run.pk).exists()


def test_tool_error_outcomes_round_trip_for_replayed_recordings() -> None:
    outcome = Outcome(output=None, cost=Decimal("0.5"), error=ToolError("timeout", "slow", True))
    assert Outcome.from_dict(outcome.as_dict()).as_dict() == outcome.as_dict()
