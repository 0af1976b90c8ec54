"""Child runs, callbacks and polls in the engine, in process: the `run`, `callback` and
`poll` steps park, and what ends their wait records the attempt (runs.engine.waiting,
runs.waits.children, runs.waits.callbacks).
The same with real workers: tests/integration/test_waits.py.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from billing.models import Organization
from common.tools.base import ToolContext, ToolError
from config.celery import app
from orchestrator import polling
from orchestrator.context import StepContext
from orchestrator.tools.asynchronous import child_run, poll
from orchestrator.transport import CeleryTransport
from runs import services
from runs.engine import control
from runs.engine.outcomes import Outcome, record
from runs.models import Run, Step, StepWait
from runs.outbox import RunMessage
from runs.plan import parse_plan
from runs.reservation import plan_reservation
from runs.selectors import RunOutputs, run_history, run_outputs
from runs.states import RunStatus
from runs.transitions import claim_next_step, claim_step
from runs.waits import callbacks, children
from runs.waits.callbacks import CallbackNotFound, CallbackRefused, Reading
from tests.integration.engine_support import assert_books_balanced
from tests.runs.engine.harness import EngineRun

pytestmark = pytest.mark.django_db

Start = Callable[[dict[str, Any]], EngineRun]

CHILD = {"name": "child", "agents": [{"name": "c", "tasks": [{"name": "t", "steps": [
    {"name": "one", "tool": "echo", "params": {"message": "${variables.word}"}},
]}]}], "variables": {"word": "plain"}}  # fmt: skip


def plan_with(step: dict[str, Any], *, after: bool = True) -> dict[str, Any]:
    steps = [step, {"name": "after", "tool": "noop"}] if after else [step]
    return {"name": "parent", "agents": [{"name": "a", "tasks": [{"name": "t", "steps": steps}]}]}


def run_step(mode: str = "sync", plan: Any = None, **extra: Any) -> dict[str, Any]:
    params: dict[str, Any] = {"plan": plan or CHILD, "execution_mode": mode}
    params.update(extra.pop("params", {}))
    return {"name": "spawn", "tool": "run", "params": params, **extra}


def ctx(step: Step) -> ToolContext:
    return ToolContext(
        step_id=step.pk, run_id=str(step.run_id), attempt=step.attempts, timeout_s=30
    )


def spawn(engine: EngineRun, name: str = "spawn", params: dict[str, Any] | None = None) -> Step:
    """Run the `run` tool as a worker would, and record its wait."""
    step = engine.step(name)
    result = child_run(params or dict(step.params), ctx(step))
    return engine.finish(name, Outcome(wait=result.wait))


def child_of(step: Step) -> Run:
    return Run.objects.get(parent_step=step)


def drive(engine: EngineRun, run: Run, outcome: Outcome | None = None) -> Run:
    """Pick ``run`` up and finish every step it dispatches, as workers would."""
    with engine._committed():
        control.pick_up(run.pk)
    while True:
        claimed = claim_next_step(run.pk, worker="test", task_id="t", lease_seconds=60)
        if claimed is None:
            break
        with engine._committed():
            record(claimed["id"], run.pk, claimed["attempts"], outcome or Outcome(output="done"))
    return Run.objects.get(pk=run.pk)


def tell(engine: EngineRun, child: Run) -> bool:
    """Deliver the CHILD_ENDED message the child's end published."""
    assert (RunMessage.CHILD_ENDED, str(child.pk)) in engine.transport.runs
    with engine._committed():
        return children.child_ended(child.pk)


# --------------------------------------------------------------------------- child runs
def test_a_sync_run_step_waits_for_its_child_and_completes_with_its_outputs(
    engine_run: Start,
) -> None:
    engine = engine_run(plan_with(run_step(params={"variables": {"word": "given"}})))
    step = spawn(engine)

    child = child_of(step)
    assert step.status == "running"
    assert step.lease_expires_at is None
    assert (child.parent_run_id, child.parent_step_attempt, child.depth) == (
        engine.run.pk,
        1,
        1,
    )
    assert child.status == RunStatus.PENDING  # started: its own reservation is made
    assert child.variables == {"word": "given"}  # the step's variables over the plan's
    assert child.organization_id == engine.run.organization_id

    child = drive(engine, child)
    assert child.status == RunStatus.COMPLETED
    assert tell(engine, child)
    assert not tell(engine, child)  # told once

    step = engine.step("spawn")
    assert step.status == "completed"
    assert step.output == {
        "child_run": str(child.pk),
        "status": "completed",
        "outputs": {"c.t.one": "done"},
    }
    engine.finish("after")
    assert engine.refresh().status == RunStatus.COMPLETED
    assert_books_balanced(engine.run)
    assert_books_balanced(child)


@pytest.mark.parametrize(
    ("ending", "code"), [("fail", "child_failed"), ("cancel", "child_cancelled")]
)
def test_a_sync_step_fails_with_its_child(engine_run: Start, ending: str, code: str) -> None:
    engine = engine_run(plan_with(run_step()))
    child = child_of(spawn(engine))
    if ending == "fail":
        drive(engine, child, Outcome(error=ToolError("invalid_input", "bad word", False)))
    else:
        with engine._committed():
            services.run_cancel(run_id=child.pk, reason="not needed")
    tell(engine, Run.objects.get(pk=child.pk))

    step = engine.step("spawn")
    assert step.status == "failed"
    assert step.error["code"] == code
    assert engine.refresh().status == RunStatus.FAILED
    assert_books_balanced(engine.run)


def test_an_async_poll_step_completes_at_once_and_the_child_runs_on(engine_run: Start) -> None:
    engine = engine_run(plan_with(run_step("async_poll")))
    step = spawn(engine)
    child = child_of(step)

    assert step.status == "completed"
    assert step.output == {"child_run": str(child.pk)}
    engine.finish("after")
    assert engine.refresh().status == RunStatus.COMPLETED
    assert drive(engine, child).status == RunStatus.COMPLETED
    assert tell(engine, child)  # recorded, nothing waits
    assert Run.objects.get(pk=child.pk).parent_notified_at is not None


def callback_plan() -> dict[str, Any]:
    handlers = [
        {"name": "read", "tool": "echo", "params": {
            "message": "${callback.status}", "outputs": "${callback.outputs}",
            "child": "${callback.child_run}", "error": "${callback.error}",
        }},
        {"name": "last", "tool": "noop"},
    ]  # fmt: skip
    return plan_with(run_step("async_callback", on_callback=handlers))


@pytest.mark.parametrize("child_fails", [False, True])
def test_an_async_callback_step_runs_its_handlers_when_the_child_ends(
    engine_run: Start, child_fails: bool
) -> None:
    engine = engine_run(callback_plan())
    step = spawn(engine)
    child = child_of(step)
    handlers = Step.objects.filter(callback_for=step).order_by("position")

    assert step.status == "completed"
    assert step.output == {"child_run": str(child.pk)}
    assert [h.name for h in handlers] == ["spawn.on_callback.read", "spawn.on_callback.last"]
    assert [h.pending_dependencies for h in handlers] == [1, 1]
    engine.finish("after")
    # The parent does not complete while the callback is outstanding.
    assert engine.refresh().status == RunStatus.RUNNING

    if child_fails:
        drive(engine, child, Outcome(error=ToolError("invalid_input", "no", False)))
    else:
        drive(engine, child)
    tell(engine, Run.objects.get(pk=child.pk))
    read = engine.step("spawn.on_callback.read")
    assert engine.transport.steps[-1].step_id == read.pk
    context = StepContext(read, read.run_id)
    assert context(("callback", "status")) == ("failed" if child_fails else "completed")
    assert context(("callback", "child_run")) == str(child.pk)
    if child_fails:
        assert context(("callback", "error", "code")) == "invalid_input"
        assert context(("callback", "outputs")) == {}
    else:
        assert context(("callback", "outputs")) == {"c.t.one": "done"}
        assert context(("callback", "error")) is None

    engine.finish("spawn.on_callback.read")
    assert engine.refresh().status == RunStatus.RUNNING  # its handlers still run
    engine.finish("spawn.on_callback.last")
    assert engine.refresh().status == RunStatus.COMPLETED
    assert_books_balanced(engine.run)
    assert_books_balanced(child)


def test_a_child_that_would_be_too_deep_fails_its_step(engine_run: Start, settings: Any) -> None:
    engine = engine_run(plan_with(run_step()))
    Run.objects.filter(pk=engine.run.pk).update(depth=settings.RUN_MAX_DEPTH)
    step = spawn(engine)

    assert step.status == "failed"
    assert step.error["code"] == "run_depth_exceeded"
    assert not Run.objects.filter(parent_run=engine.run).exists()


def test_a_templated_plan_is_validated_when_the_step_runs(engine_run: Start) -> None:
    engine = engine_run(
        {**plan_with(run_step(plan="${variables.sub}")), "variables": {"sub": {"name": "x"}}}
    )
    step = engine.step("spawn")
    params = {**step.params, "plan": {"name": "x", "agents": []}}  # as rendered
    step = spawn(engine, params=params)

    assert step.status == "failed"
    assert step.error["code"] == "invalid_plan"
    assert "agents" in step.error["message"]
    assert not Run.objects.filter(parent_run=engine.run).exists()


def test_a_child_the_organization_cannot_pay_for_fails_its_step(engine_run: Start) -> None:
    engine = engine_run(plan_with(run_step(plan={**CHILD, "credits": "100000"})))
    step = spawn(engine)

    assert step.status == "failed"
    assert step.error["code"] == "insufficient_credits"
    assert not Run.objects.filter(parent_run=engine.run).exists()
    assert_books_balanced(engine.run)


def test_parking_twice_starts_one_child(engine_run: Start) -> None:
    engine = engine_run(plan_with(run_step()))
    step = spawn(engine)
    wait = child_run(dict(step.params), ctx(step)).wait
    with engine._committed():
        assert record(step.pk, engine.run.pk, step.attempts, Outcome(wait=wait))

    assert Run.objects.filter(parent_run=engine.run).count() == 1


@pytest.mark.parametrize("mode", ["sync", "async_poll", "async_callback"])
def test_cancelling_a_parent_cancels_its_children_whatever_their_mode(
    engine_run: Start, mode: str
) -> None:
    spec = callback_plan() if mode == "async_callback" else plan_with(run_step(mode))
    engine = engine_run(spec)
    child = child_of(spawn(engine))
    grandchild_plan = plan_with(run_step("async_poll"))  # the child has one of its own
    Run.objects.filter(pk=child.pk).update(plan=grandchild_plan)
    with engine._committed():
        services.run_cancel(run_id=engine.run.pk, reason="stop it all")

    child = Run.objects.get(pk=child.pk)
    assert child.status == RunStatus.CANCELLED
    assert "stop it all" in child.cancel_reason
    assert_books_balanced(child)
    assert_books_balanced(engine.refresh())


@pytest.mark.parametrize(("mode", "cancelled"), [("sync", True), ("async_poll", False)])
def test_a_failing_parent_stops_the_children_it_waits_for(
    engine_run: Start, mode: str, cancelled: bool
) -> None:
    engine = engine_run(plan_with(run_step(mode)))
    child = child_of(spawn(engine))
    with engine._committed():
        services.run_fail(run_id=engine.run.pk, code="timeout", message="too slow")

    status = Run.objects.get(pk=child.pk).status
    assert status == (RunStatus.CANCELLED if cancelled else RunStatus.PENDING)


def test_the_sweep_tells_a_parent_whose_message_was_lost(engine_run: Start) -> None:
    engine = engine_run(plan_with(run_step()))
    child = drive(engine, child_of(spawn(engine)))
    past = timezone.now() + timedelta(minutes=5)
    assert timezone.now() < callbacks.next_due() <= past

    with engine._committed():
        assert callbacks.sweep(now=past)["children_told"] == 1
        assert callbacks.sweep(now=past)["children_told"] == 0
    assert engine.step("spawn").status == "completed"
    assert child.pk


def test_a_sync_child_outliving_its_step_timeout_is_cancelled(engine_run: Start) -> None:
    engine = engine_run(plan_with(run_step(timeout="5s", retry={"max_attempts": 1})))
    child = child_of(spawn(engine))
    # Beat's look: due when the step's 5 s have passed since the child was made.
    assert callbacks.next_due() == child.created_at + timedelta(seconds=5)

    with engine._committed():
        swept = callbacks.sweep(now=timezone.now() + timedelta(seconds=6))
    assert swept["children_timed_out"] == 1
    assert Run.objects.get(pk=child.pk).status == RunStatus.CANCELLED
    step = engine.step("spawn")
    assert step.status == "failed"
    assert step.error["cause"] == "timeout"
    assert not children.child_ended(child.pk)  # its own end changes nothing more


# --------------------------------------------------------------------------- callbacks
def open_and_park(engine: EngineRun, seconds: float = 60) -> tuple[Step, str]:
    """A `callback` step's attempt as the executor runs it: URL opened, step parked."""
    step = engine.step("hook")
    Step.objects.filter(pk=step.pk).update(next_run_at=None)
    claimed = claim_step(step.pk, worker="test", task_id="hook", lease_seconds=60)
    assert claimed is not None
    opening = callbacks.new_callback()
    opened = callbacks.open_callback(
        opening, step_id=step.pk, attempt=claimed["attempts"], expires_in=seconds
    )
    assert opened["url"].endswith(f"/api/v1/callbacks/{opening.token}")
    with engine._committed():
        wait = {"kind": "callback", **opened, "request": None}
        record(step.pk, engine.run.pk, claimed["attempts"], Outcome(wait=wait))
    return Step.objects.get(pk=step.pk), opening.token


HOOK = {"name": "hook", "tool": "callback", "params": {"timeout": 60}}


def test_a_callback_completes_its_step_once(engine_run: Start) -> None:
    engine = engine_run(plan_with(HOOK))
    step, token = open_and_park(engine)
    assert step.status == "running"
    assert step.lease_expires_at is None

    with engine._committed():
        callbacks.receive_callback(token, status="completed", result={"answer": 42})
    assert engine.step("hook").output == {"answer": 42}
    with pytest.raises(CallbackRefused) as again:
        callbacks.receive_callback(token, status="completed", result={"answer": 43})
    assert (again.value.status, again.value.code) == (409, "callback_used")
    assert engine.step("hook").output == {"answer": 42}


def test_a_suspended_organizations_callback_is_refused_and_taken_once_it_is_lifted(
    engine_run: Start,
) -> None:
    """The URL carries no key: its run's organization is what is suspended. Nothing is
    recorded, and the same URL is good once the suspension is lifted."""
    engine = engine_run(plan_with(HOOK))
    _, token = open_and_park(engine)
    organization = Organization.objects.filter(pk=engine.run.organization_id)
    organization.update(suspended_at=timezone.now())

    with pytest.raises(CallbackRefused) as refused:
        callbacks.receive_callback(token, status="completed", result={"answer": 42})
    answered = Client().post(
        f"/api/v1/callbacks/{token}", {"status": "completed"}, content_type="application/json"
    )

    assert (refused.value.status, refused.value.code) == (409, "organization_suspended")
    assert (answered.status_code, answered.json()["code"]) == (409, "organization_suspended")
    assert StepWait.objects.get(step=engine.step("hook")).status == "waiting"
    organization.update(suspended_at=None)
    with engine._committed():
        callbacks.receive_callback(token, status="completed", result={"answer": 42})
    assert engine.step("hook").output == {"answer": 42}


def test_the_callbacks_event_shows_its_id_never_its_token(engine_run: Start) -> None:
    engine = engine_run(plan_with(HOOK))
    _, token = open_and_park(engine)
    head, _, secret = token.partition(".")

    (event,) = run_history(engine.run).filter(kind="wait")
    assert event.payload == {"wait": str(uuid.UUID(hex=head)), "request": None}
    assert event.message == f"waiting for callback {uuid.UUID(hex=head)}"
    assert secret not in str(run_history(engine.run).values())


def test_the_runs_organization_ends_a_callback_by_its_id_once(engine_run: Start) -> None:
    engine = engine_run(plan_with(HOOK))
    _, token = open_and_park(engine)
    callback_id = uuid.UUID(hex=token.partition(".")[0])
    run = engine.refresh()

    other = engine_run(plan_with(HOOK)).refresh()
    with pytest.raises(CallbackNotFound):  # another run's callback id names nothing here
        callbacks.receive_callback_of(
            run=other, callback_id=callback_id, actor="key x", status="completed"
        )
    with engine._committed():
        callbacks.receive_callback_of(
            run=run, callback_id=callback_id, actor="key x", status="completed", result=7
        )
    assert engine.step("hook").output == 7
    with pytest.raises(CallbackRefused) as again:
        callbacks.receive_callback(token, status="completed", result=8)
    assert (again.value.status, again.value.code) == (409, "callback_used")
    received = run_history(run).filter(message="callback received: completed").get()
    assert received.actor == "key x"


def test_a_failed_callback_fails_the_attempt_and_the_retry_gets_a_new_url(
    engine_run: Start,
) -> None:
    engine = engine_run(plan_with(HOOK))
    _, token = open_and_park(engine)
    with engine._committed():
        callbacks.receive_callback(token, status="failed", error="the build broke")

    step = engine.step("hook")
    assert step.status == "pending"  # callback_failed is retried by the step's policy
    assert step.error["code"] == "callback_failed"
    assert step.error["message"] == "the build broke"
    _, second = open_and_park(engine)
    assert second != token


def test_a_wrong_or_malformed_token_finds_no_callback(engine_run: Start) -> None:
    engine = engine_run(plan_with(HOOK))
    _, token = open_and_park(engine)
    head, _, secret = token.partition(".")
    for wrong in (f"{head}.{secret[:-1]}x", f"{head}.", head, "nothing", f"{'0' * 32}.{secret}"):
        with pytest.raises(CallbackNotFound):
            callbacks.receive_callback(wrong, status="completed")
    assert engine.step("hook").status == "running"


def test_an_expired_callback_is_refused_and_the_sweep_times_its_step_out(
    engine_run: Start,
) -> None:
    engine = engine_run(plan_with({**HOOK, "retry": {"max_attempts": 1}}))
    _, token = open_and_park(engine, seconds=0.001)
    with pytest.raises(CallbackRefused) as late:
        callbacks.receive_callback(token, status="completed")
    assert (late.value.status, late.value.code) == (410, "callback_expired")
    assert callbacks.next_due() <= timezone.now()

    with engine._committed():
        assert callbacks.sweep()["expired"] == 1
    assert callbacks.next_due() is None  # nothing left to look after
    step = engine.step("hook")
    assert step.status == "failed"
    assert step.error["cause"] == "timeout"
    assert engine.refresh().status == RunStatus.FAILED
    assert_books_balanced(engine.run)


def test_a_callback_after_the_run_was_cancelled_is_closed(engine_run: Start) -> None:
    engine = engine_run(plan_with(HOOK))
    _, token = open_and_park(engine)
    with engine._committed():
        services.run_cancel(run_id=engine.run.pk)

    with pytest.raises(CallbackRefused) as closed:
        callbacks.receive_callback(token, status="completed")
    assert (closed.value.status, closed.value.code) == (409, "callback_closed")


# --------------------------------------------------------------------------- polls
POLL: dict[str, Any] = {"name": "watch", "tool": "poll", "params": {
    "url": "https://status.example/job/1", "interval": 2, "max_attempts": 3,
    "done_when": "${response.body.state} == 'done'",
    "failed_when": "${response.body.state} == 'broken'",
}}  # fmt: skip


def start_poll(engine: EngineRun) -> StepWait:
    step = engine.step("watch")
    result = poll(dict(step.params), ctx(step))
    engine.finish("watch", Outcome(wait=result.wait))
    return StepWait.objects.get(step=step)


def reading(state: str) -> Reading:
    verdict = {"done": "done", "broken": "failed"}.get(state, "")
    return Reading({"status": 200, "body": {"state": state}, "headers": {}}, verdict)


def test_a_poll_reads_until_done_when_holds(engine_run: Start) -> None:
    engine = engine_run(plan_with(POLL))
    wait = start_poll(engine)
    assert engine.transport.polls == [(str(wait.pk), 1, 0.0)]
    assert engine.step("watch").status == "running"

    with engine._committed():
        assert callbacks.record_reading(wait.pk, 1, reading("running"))
        assert not callbacks.record_reading(wait.pk, 1, reading("done"))  # counted once
    assert engine.transport.polls[-1] == (str(wait.pk), 2, 2.0)
    assert callbacks.poll_due(wait.pk, 1) is None
    assert callbacks.poll_due(wait.pk, 2)
    with engine._committed():
        assert callbacks.record_reading(wait.pk, 2, reading("done"))

    step = engine.step("watch")
    assert step.status == "completed"
    assert step.output == {"status": 200, "body": {"state": "done"}, "headers": {}, "polls": 2}
    assert StepWait.objects.get(pk=wait.pk).status == "completed"


@pytest.mark.parametrize(
    ("states", "code"),
    [(["running", "broken"], "poll_failed"), (["running"] * 3, "poll_exhausted")],
)
def test_a_poll_fails_by_failed_when_or_when_its_attempts_run_out(
    engine_run: Start, states: list[str], code: str
) -> None:
    engine = engine_run(plan_with(POLL))
    wait = start_poll(engine)
    for number, state in enumerate(states, start=1):
        with engine._committed():
            callbacks.record_reading(wait.pk, number, reading(state))

    step = engine.step("watch")
    assert step.status == "failed"
    assert step.error["code"] == code
    assert_books_balanced(engine.refresh())


def test_a_poll_of_a_long_interval_is_never_one_long_countdown(
    engine_run: Start, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = engine_run(plan_with({**POLL, "params": {**POLL["params"], "interval": 3600}}))
    wait = start_poll(engine)
    with engine._committed():
        callbacks.record_reading(wait.pk, 1, reading("running"))
    assert engine.transport.polls[-1] == (str(wait.pk), 2, 3600.0)
    sent: list[tuple[Any, Any]] = []
    monkeypatch.setattr(app, "send_task", lambda name, args=(), **o: sent.append((args, o)))

    # Published, the hour's countdown is RATE_LIMIT_MAX_COUNTDOWN_S (a message held longer
    # would come back at every visibility timeout) ...
    CeleryTransport().schedule_poll(str(wait.pk), 2, 3600.0)
    assert sent == [((str(wait.pk), 2), sent[0][1])]
    assert sent[0][1]["countdown"] == settings.RATE_LIMIT_MAX_COUNTDOWN_S == 300
    # ... and the reading it brings, not due yet, sends itself again for the rest, reading
    # nothing.
    assert polling.poll_once(str(wait.pk), 2) is False
    wait_id, number, countdown = engine.transport.polls[-1]
    assert (wait_id, number) == (str(wait.pk), 2)
    assert 3590 < countdown <= 3600
    assert StepWait.objects.get(pk=wait.pk).polls == 1


def test_the_sweep_sends_a_lost_poll_again_and_times_one_out(engine_run: Start) -> None:
    engine = engine_run(plan_with({**POLL, "retry": {"max_attempts": 1}}))
    wait = start_poll(engine)
    later = timezone.now() + timedelta(minutes=1)
    StepWait.objects.filter(pk=wait.pk).update(expires_at=later + timedelta(hours=1))
    assert timezone.now() < callbacks.next_due() <= later

    assert callbacks.sweep(now=later)["polls_resent"] == 1
    assert engine.transport.polls[-1] == (str(wait.pk), 1, 0.0)
    StepWait.objects.filter(pk=wait.pk).update(expires_at=timezone.now())
    with engine._committed():
        assert callbacks.sweep()["expired"] == 1
    assert engine.step("watch").error["cause"] == "timeout"
    assert callbacks.poll_due(wait.pk, 1) is None


def test_the_reservation_counts_on_callback_handlers() -> None:
    with_handlers = plan_reservation(parse_plan(callback_plan()))
    without = plan_reservation(parse_plan(plan_with(run_step("async_poll"))))
    assert with_handlers - without == Decimal("0.01") * 3 * 2  # echo and noop, 3 attempts


def test_a_runs_outputs_stop_at_their_byte_limit(engine_run: Start) -> None:
    steps = [{"name": f"s{i}", "tool": "noop"} for i in range(3)]
    engine = engine_run({"name": "p", "agents": [{"name": "a", "tasks": [
        {"name": "t", "steps": steps}]}]})  # fmt: skip
    for i in range(3):
        engine.finish(f"s{i}", Outcome(output="x" * 20))

    whole = run_outputs(engine.refresh())
    assert whole == RunOutputs({f"a.t.s{i}": "x" * 20 for i in range(3)}, truncated=False)
    cut = run_outputs(engine.run, max_bytes=60)
    assert cut == RunOutputs({"a.t.s0": "x" * 20}, truncated=True)


def test_a_child_ending_while_its_parent_is_paused_runs_the_handlers_after_resume(
    engine_run: Start,
) -> None:
    engine = engine_run(callback_plan())
    child = child_of(spawn(engine))
    engine.finish("after")
    with engine._committed():
        services.run_pause(run_id=engine.run.pk)
    tell(engine, drive(engine, child))
    read = engine.step("spawn.on_callback.read")
    assert read.status == "paused"
    assert read.pending_dependencies == 0  # released, held by the pause alone

    with engine._committed():
        services.run_resume(run_id=engine.run.pk)
        control.resume(engine.run.pk)
    assert engine.transport.steps[-1].step_id == read.pk
    engine.finish("spawn.on_callback.read")
    engine.finish("spawn.on_callback.last")
    assert engine.refresh().status == RunStatus.COMPLETED
