"""The hot path (``runs.engine.hotpath``) records exactly what the general path would.

Each plan is played twice by the same script of outcomes, once as the engine runs and
once with the hot path switched off, and everything the two leave behind is compared:
every step, task, agent and run row (statuses, counters, outputs, costs, errors), every
event in order, every ledger entry, and every message sent. Then the cases the hot path
must hand over are pinned down: a charge beyond the reservation, and a result for a step
that is no longer running.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest
from django.db import connection

from billing.models import LedgerEntry, Organization, Reservation
from common.invariants import violations
from common.tools.base import ToolError
from runs.engine import hotpath
from runs.engine.outcomes import Outcome, record
from runs.models import Agent, Run, RunAttempt, Step, Task
from runs.people import approvals
from runs.selectors import run_history
from runs.states import StepStatus
from tests.runs.engine.harness import EngineRun

Start = Callable[[dict[str, Any]], EngineRun]
# A step's outcome by its name and attempt.
Script = Callable[[str, int], Outcome]


@pytest.fixture
def start(engine_run: Start) -> Start:
    return engine_run


def step(name: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "tool": "noop", **extra}


def one_agent(*tasks: dict[str, Any], **agent: Any) -> dict[str, Any]:
    return {"name": "hot", "agents": [{"name": "a", "tasks": list(tasks), **agent}]}


def succeed(name: str, attempt: int) -> Outcome:
    return Outcome(output={"step": name, "attempt": attempt}, cost=Decimal("0.002"))


def flaky(name: str, attempt: int) -> Outcome:
    """Steps named ``flaky*`` fail once (retryable), ``broken*`` fail for good, ``skip*``
    are skipped; the rest succeed, some with no output and no cost."""
    if name.startswith("flaky") and attempt == 1:
        return Outcome(error=ToolError("http_error", "503", True), cost=Decimal("0.001"))
    if name.startswith("broken"):
        return Outcome(error=ToolError("tool_error", "no", False), cost=Decimal("0.001"))
    if name.startswith("skip"):
        return Outcome(skipped=True)
    if name.startswith("free"):
        return Outcome()
    return succeed(name, attempt)


PLANS: dict[str, tuple[dict[str, Any], Script]] = {
    "sequential": (
        one_agent({"name": "t", "steps": [step(f"s{i}") for i in range(6)]}),
        succeed,
    ),
    "parallel under a limit": (
        one_agent(
            {
                "name": "t",
                "mode": "parallel",
                "max_concurrent_steps": 3,
                "steps": [step(f"p{i}") for i in range(8)],
            }
        ),
        flaky,
    ),
    "dag of steps": (
        one_agent(
            {
                "name": "t",
                "mode": "dag",
                "max_concurrent_steps": 2,
                "steps": [
                    step("root"),
                    step("left", depends_on=["root"]),
                    step("right", depends_on=["root"]),
                    step("free-middle", depends_on=["root"]),
                    step("join", depends_on=["left", "right", "free-middle"]),
                    step("tail", depends_on=["join"]),
                ],
            }
        ),
        flaky,
    ),
    "dag of one-step tasks under a limit": (
        one_agent(
            {"name": "root", "steps": [step("r")]},
            {"name": "left", "depends_on": ["root"], "steps": [step("l")]},
            {
                "name": "right",
                "depends_on": ["root"],
                "steps": [step("flaky-r", retry={"jitter": 0})],
            },
            {"name": "wide", "depends_on": ["root"], "steps": [step("w1"), step("w2")]},
            {"name": "far", "steps": [step("f")]},
            {"name": "join", "depends_on": ["left", "right", "wide"], "steps": [step("j")]},
            {
                "name": "fan",
                "depends_on": ["join"],
                "mode": "parallel",
                "max_concurrent_steps": 2,
                "steps": [step("fa"), step("fb"), step("fc")],
            },
            {"name": "gate", "depends_on": ["far"], "steps": [step("g", tool="approval")]},
            mode="dag",
            max_concurrent_tasks=2,
        ),
        flaky,
    ),
    "two agents, sequential tasks": (
        {
            "name": "hot",
            "agents": [
                {
                    "name": "first",
                    "tasks": [{"name": f"t{i}", "steps": [step(f"a{i}")]} for i in range(4)],
                },
                {
                    "name": "second",
                    "depends_on": ["first"],
                    "tasks": [
                        {"name": f"t{i}", "steps": [step(f"b{i}"), step(f"free-{i}")]}
                        for i in range(3)
                    ],
                },
            ],
            "mode": "dag",
        },
        flaky,
    ),
    "retries, skips, handlers, approvals, several tasks": (
        one_agent(
            {
                "name": "first",
                "failure_mode": "continue",
                "steps": [
                    step("flaky-one", retry={"max_attempts": 3, "backoff": "fixed", "jitter": 0}),
                    step("skip-me"),
                    step("gate", tool="approval"),
                    step("broken", on_error=[{"name": "fix", "tool": "noop"}]),
                    step("after"),
                    step("free-last"),
                ],
            },
            {
                "name": "second",
                "mode": "parallel",
                "steps": [step("x"), step("y"), step("z")],
            },
            mode="sequential",
        ),
        flaky,
    ),
}


def play(run: EngineRun, script: Script) -> None:
    """Act as the workers and the approver: every message is taken in the order sent."""
    handled = 0
    for _ in range(500):
        if handled < len(run.transport.steps):
            message = run.transport.steps[handled]
            handled += 1
            row = Step.objects.get(pk=message.step_id)
            if row.status == StepStatus.PENDING:
                run.finish_step(row, script(row.name, row.attempts + 1))
            continue
        waiting = Step.objects.filter(run=run.run, status=StepStatus.WAITING_APPROVAL)
        if not waiting.exists():
            return
        with run._committed():
            approvals.run_approve(run_id=run.run.pk, actor="test")
    raise AssertionError("the run did not settle")


def snapshot(run: Run) -> dict[str, Any]:
    """Everything the run left behind, with ids replaced by names and no timestamps."""
    steps = {s.pk: s for s in Step.objects.filter(run=run)}
    tasks = {t.pk: t for t in Task.objects.filter(run=run)}
    agents = {a.pk: a for a in Agent.objects.filter(run=run)}
    labels = {
        "step": {str(pk): f"{s.name}@{s.generation}" for pk, s in steps.items()},
        "task": {str(pk): f"{t.name}@{t.generation}" for pk, t in tasks.items()},
        "agent": {str(pk): a.name for pk, a in agents.items()},
        "run": {str(run.pk): "run"},
    }
    run = Run.objects.get(pk=run.pk)
    return {
        "run": (run.status, run.open_children, run.active_children, run.waiting_approvals),
        "agents": sorted(
            (a.name, a.status, a.open_children, a.active_children) for a in agents.values()
        ),
        "tasks": sorted(
            (t.name, t.generation, t.status, t.open_children, t.active_children, t.retry_count)
            for t in tasks.values()
        ),
        "steps": sorted(
            (
                s.name,
                s.generation,
                s.status,
                s.attempts,
                s.failures,
                s.dispatched_at is not None,
                s.pending_dependencies,
                repr(s.output),
                s.cost,
                repr(s.error),
                s.handled,
                s.completed_at is not None,
                s.duration_ms is not None,
                s.lease_expires_at is None,
            )
            for s in steps.values()
        ),
        "events": [
            (
                e.entity,
                labels[e.entity].get(e.entity_id, e.entity_id),
                e.kind,
                e.from_status,
                e.to_status,
                e.actor,
                e.message,
                _named(e.payload, labels["step"]),
            )
            for e in run_history(run).order_by("id")
        ],
        "attempts": [
            (a.attempt_number, a.outcome, a.finished_at is not None)
            for a in RunAttempt.objects.filter(run=run).order_by("attempt_number")
        ],
        "reservations": [
            (r.attempt_number, r.reserved, r.charged, r.refunded, r.settled_at is not None)
            for r in Reservation.objects.filter(run_id=run.pk).order_by("attempt_number")
        ],
        "ledger": sorted(
            (
                e.type,
                e.amount,
                e.reason.replace(str(run.pk), "<run>"),
                e.actor,
                labels["step"].get(str(e.step_id)),
                e.attempt_id is not None,
            )
            for e in LedgerEntry.objects.filter(run_id=run.pk)
        ),
    }


def _named(payload: dict[str, Any], steps: dict[str, str]) -> dict[str, Any]:
    """An approval's payload lists step ids: by name instead."""
    if not isinstance(payload.get("steps"), list):
        return payload
    return {**payload, "steps": [steps[str(pk)] for pk in payload["steps"]]}


def hot_path_calls(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Spy on the hot path: one entry per attempt it was asked to record (True: it did)."""
    calls: list[bool] = []
    complete = hotpath.complete

    def spy(*args: Any, **kwargs: Any) -> tuple[hotpath.Completed | None, Any]:
        done = complete(*args, **kwargs)
        calls.append(done[0] is not None)
        return done

    monkeypatch.setattr(hotpath, "complete", spy)
    return calls


@pytest.mark.parametrize("name", list(PLANS))
def test_the_hot_path_leaves_exactly_what_the_general_path_leaves(
    name: str, start: Start, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec, script = PLANS[name]
    with monkeypatch.context() as off:
        off.setattr(hotpath, "eligible", lambda *args: False)
        off.setattr(hotpath, "start", lambda *args: None)
        general = start(spec)
        play(general, script)
    general_sent = general.sent()
    general.transport.steps.clear()  # one transport for both runs
    calls = hot_path_calls(monkeypatch)
    hot = start(spec)
    play(hot, script)

    assert any(calls), "the hot path was never taken"
    expected, found = snapshot(general.run), snapshot(hot.run)
    for part in expected:  # part by part, with the lines that differ
        difference = "\n".join(
            difflib.unified_diff(list(map(repr, expected[part])), list(map(repr, found[part])))
        )
        assert found[part] == expected[part], f"{part} differ:\n{difference}"
    assert hot.sent() == general_sent
    assert hot.refresh().status == general.refresh().status
    assert violations() == {}


def test_the_runs_last_step_completes_task_agent_run_and_settles_on_the_hot_path(
    start: Start, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = hot_path_calls(monkeypatch)
    run = start(one_agent({"name": "t", "steps": [step("one"), step("two"), step("three")]}))
    organization = run.run.organization
    reserved = Reservation.objects.get(run_id=run.run.pk).reserved
    before = Organization.objects.get(pk=organization.pk).credits_available

    run.finish("one")
    run.finish("two")
    run.finish("three", Outcome(output={"last": True}, cost=Decimal("0.002")))

    assert calls == [True, True, True]
    finished = run.refresh()
    assert finished.status == "completed"
    assert finished.completed_at is not None
    assert finished.duration_ms is not None
    assert (finished.open_children, finished.active_children) == (0, 0)
    attempt = RunAttempt.objects.get(run=run.run)
    assert (attempt.outcome, attempt.finished_at) == ("completed", finished.completed_at)
    reservation = Reservation.objects.get(run_id=run.run.pk)
    refund = LedgerEntry.objects.get(run_id=run.run.pk, type="refund")
    charge = LedgerEntry.objects.get(run_id=run.run.pk, type="charge")  # the attempt's one
    charged = Decimal("0.002")
    assert (charge.amount, charge.idempotency_key) == (charged, f"charge:{attempt.pk}")
    assert reservation.settled_at is not None
    assert (reservation.charged, reservation.refunded) == (charged, reserved - charged)
    assert refund.amount == reserved - charged
    assert refund.idempotency_key == f"refund:{attempt.pk}"
    assert Organization.objects.get(pk=organization.pk).credits_available == before + refund.amount
    last = list(run_history(run.run).order_by("id"))[-5:]
    assert [(e.entity, e.kind, e.to_status, e.actor) for e in last] == [
        ("step", "transition", "completed", "system"),
        ("task", "transition", "completed", "system"),
        ("agent", "transition", "completed", "system"),
        ("run", "transition", "completed", "engine"),
        ("run", "charge", "", "engine"),
    ]
    assert last[-1].payload == {"type": "refund", "amount": str(refund.amount)}
    assert violations() == {}


def test_the_runs_last_step_takes_the_general_path_when_another_agent_is_open(
    start: Start, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = hot_path_calls(monkeypatch)
    run = start(
        {
            "name": "two",
            "agents": [
                {"name": "a", "tasks": [{"name": "t", "steps": [step("one")]}]},
                {"name": "b", "tasks": [{"name": "t", "steps": [step("two")]}]},
            ],
        }
    )

    run.finish("one")  # agent b is still open: the run goes on
    run.finish("two")

    assert calls == [False, True]
    assert run.refresh().status == "completed"
    assert LedgerEntry.objects.filter(run_id=run.run.pk, type="refund").count() == 1


def test_a_one_step_task_completes_with_its_step_on_the_hot_path(
    start: Start, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = hot_path_calls(monkeypatch)
    run = start(
        one_agent(
            {"name": "first", "steps": [step("one")]},
            {"name": "second", "depends_on": ["first"], "steps": [step("two")]},
            {"name": "third", "depends_on": ["second"], "steps": [step("three")]},
            mode="dag",
        )
    )
    run.finish("one")
    run.finish("two")
    run.finish("three")  # the run's last step: the agent and the run finish with it

    assert calls == [True, True, True]
    tasks = {t.name: t for t in Task.objects.filter(run=run.run)}
    assert {name: t.status for name, t in tasks.items()} == dict.fromkeys(tasks, "completed")
    assert all(t.completed_at and t.duration_ms is not None for t in tasks.values())
    assert run.sent() == ["one", "two", "three"]
    assert run.refresh().status == "completed"


def test_a_charge_beyond_the_reservation_on_the_hot_path_fails_the_step_and_keeps_nothing(
    start: Start, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = hot_path_calls(monkeypatch)
    run = start(one_agent({"name": "t", "steps": [step("one"), step("two")]}))
    held = Reservation.objects.get(run_id=run.run.pk).held

    one = run.finish("one", Outcome(output={"big": True}, cost=held + Decimal(1)))

    assert calls == [False]  # the reservation could not pay: nothing written there
    assert one.status == "failed"
    assert one.error["code"] == "budget_exhausted"
    assert one.output is None
    assert run.step("two").dispatched_at is None
    assert run.sent() == ["one"]
    assert Reservation.objects.get(run_id=run.run.pk).charged == Decimal(0)
    assert not LedgerEntry.objects.filter(run_id=run.run.pk, type="charge").exists()
    assert not run_history(run.run).filter(to_status="completed", entity="step").exists()
    assert run.refresh().status == "failed"


def test_a_late_result_is_dropped_by_the_hot_path_too(start: Start) -> None:
    run = start(one_agent({"name": "t", "steps": [step("one"), step("two")]}))
    one = run.step("one")
    run.finish_step(one, Outcome(output={"first": True}))
    events = run_history(run.run).count()

    charged = Reservation.objects.get(run_id=run.run.pk).charged

    # The same attempt reported again (a redelivered recording): nothing changes.
    record(one.pk, run.run.pk, 1, Outcome(output={"second": True}, cost=Decimal(1)))

    assert run.step("one").output == {"first": True}
    assert run_history(run.run).count() == events
    assert Reservation.objects.get(run_id=run.run.pk).charged == charged
    assert run.sent() == ["one", "two"]


def start_calls(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Spy on the pick-up's start: one entry per run it was asked to start (True: it did)."""
    calls: list[bool] = []
    original = hotpath.start

    def spy(*args: Any, **kwargs: Any) -> hotpath.Started | None:
        started = original(*args, **kwargs)
        calls.append(started is not None)
        return started

    monkeypatch.setattr(hotpath, "start", spy)
    return calls


def test_a_picked_up_run_starts_in_one_statement_unless_an_approval_is_ready(
    start: Start, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = start_calls(monkeypatch)
    plain = start(
        {
            "name": "two agents",
            "mode": "parallel",
            "agents": [
                {"name": "a", "tasks": [{"name": "t", "steps": [step("one"), step("two")]}]},
                {"name": "b", "tasks": [{"name": "t", "steps": [step("three")]}]},
            ],
        }
    )
    gated = start(one_agent({"name": "t", "steps": [step("gate", tool="approval")]}))

    assert calls == [True, False]
    assert Agent.objects.filter(run=plain.run, status="running").count() == 2
    assert plain.refresh().active_children == 2
    assert plain.sent() == ["one", "three"]  # agents in order, each task's first step
    assert gated.refresh().status == "waiting_approval"  # the general path made it wait


HEAP_XMAX_IS_MULTI = 0x1000  # a tuple header's infomask bit (PostgreSQL's htup_details.h)


def xmax_is_a_multixact(ctid: str) -> bool:
    """Whether the step row version at ``ctid`` was locked or updated under a MultiXact
    (its page read as it is in shared buffers, this transaction's changes included)."""
    block, line = (int(part) for part in ctid.strip("()").split(","))
    with connection.cursor() as cursor:
        cursor.execute("CREATE EXTENSION IF NOT EXISTS pageinspect")
        cursor.execute(
            "SELECT t_infomask FROM heap_page_items(get_raw_page('runs_step', %s)) WHERE lp = %s",
            [block, line],
        )
        return bool(cursor.fetchone()[0] & HEAP_XMAX_IS_MULTI)


def test_a_leafs_recording_takes_no_multixact_on_its_steps_row(
    start: Start, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The leaf's writes are in a block that may roll back (a subtransaction): a row
    # locked before it and updated inside it took a MultiXact, one per fan-out step.
    calls = hot_path_calls(monkeypatch)
    run = start(one_agent({"name": "t", "mode": "parallel", "steps": [step("a"), step("b")]}))
    attempt = run.claim("a")
    with connection.cursor() as cursor:
        cursor.execute("SELECT ctid::text FROM runs_step WHERE id = %s", [run.step("a").pk])
        claimed_version = cursor.fetchone()[0]

    run.record("a", attempt)

    assert calls == [True]
    assert run.step("a").status == "completed"
    assert not xmax_is_a_multixact(claimed_version)
