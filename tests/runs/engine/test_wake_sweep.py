"""Steps parked beyond the step-message horizon (RATE_LIMIT_MAX_COUNTDOWN_S) are asleep:
no message carries them, and the wake sweep (runs.engine.dispatch.wake_asleep) sends
each with its exact countdown once its time is within the horizon. In process against
PostgreSQL, the sweep driven with its own clock: a wait, a retry's long backoff, a pause
and its resume, a cancel, and a wake sweep that never came (the lost-message sweep)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from decimal import Decimal

from django.utils import timezone

from common.tools.base import ToolError
from orchestrator import sweeps
from runs import services
from runs.engine import control, dispatch
from runs.engine.outcomes import Outcome
from runs.models import Step
from tests import factories
from tests.runs.engine.harness import EngineRun, waits

Start = Callable[..., EngineRun]
HOUR_MS = 3_600_000


def countdowns(run: EngineRun) -> dict[str, float]:
    """The countdown of the last message published for each step, by name."""
    names = dict(Step.objects.filter(run=run.run).values_list("pk", "name"))
    return {names[m.step_id]: m.countdown_s for m in run.transport.steps if m.step_id in names}


def sweep_at(run: EngineRun, moment: datetime) -> int:
    with run.committed():
        return dispatch.wake_asleep(now=moment)


def test_a_wait_within_the_horizon_has_its_message_and_one_beyond_it_has_none(
    engine_run: Start,
) -> None:
    run = engine_run(waits({"for": "1m"}, {"for": "1h"}))
    run.transport.steps.clear()

    run.park("w0", 60_000)
    run.park("w1", HOUR_MS)

    assert countdowns(run).keys() == {"w0"}
    assert 59 < countdowns(run)["w0"] <= 60
    assert (run.step("w0").asleep, run.step("w1").asleep) == (False, True)
    wake = run.step("w1").next_run_at
    assert wake is not None
    assert dispatch.asleep_next_due() == wake - timedelta(seconds=300)
    assert sweep_at(run, wake - timedelta(seconds=301)) == 0
    assert sweep_at(run, wake - timedelta(seconds=120)) == 1
    assert countdowns(run)["w1"] == 120
    assert (run.step("w1").asleep, dispatch.asleep_next_due()) == (False, None)


def test_a_late_sweep_sends_a_step_already_due_at_once_and_never_twice(
    engine_run: Start,
) -> None:
    run = engine_run(waits({"for": "1h"}))
    run.park("w0", HOUR_MS)
    wake = run.step("w0").next_run_at
    assert wake is not None
    run.transport.steps.clear()

    assert sweep_at(run, wake + timedelta(minutes=5)) == 1
    assert sweep_at(run, wake + timedelta(minutes=6)) == 0

    assert countdowns(run) == {"w0": 0.0}  # at once (its run's doorbell)


def test_a_retry_backoff_beyond_the_horizon_sleeps_until_the_sweep_sends_it(
    engine_run: Start,
) -> None:
    retry = {"max_attempts": 3, "backoff": "fixed", "base_delay_ms": 600_000, "jitter": 0}
    plan = factories.plan(steps=0)
    plan["agents"][0]["tasks"][0]["steps"] = [factories.step("s", retry=retry)]
    run = engine_run(plan)
    run.transport.steps.clear()

    failed = Outcome(error=ToolError("timeout", "slow", True), cost=Decimal("0.01"))
    run.record("s", run.claim("s"), failed)

    step = run.step("s")
    assert (step.status, step.asleep) == ("pending", True)
    assert step.next_run_at is not None
    assert countdowns(run) == {}
    assert sweep_at(run, step.next_run_at - timedelta(seconds=300)) == 1
    assert countdowns(run) == {"s": 300.0}


def test_a_paused_run_is_not_woken_and_its_resume_sends_what_is_near_and_leaves_the_rest_asleep(
    engine_run: Start,
) -> None:
    run = engine_run(waits({"for": "1h"}, {"for": "1h"}))
    run.park("w0", HOUR_MS)
    run.park("w1", HOUR_MS)
    with run.committed():
        services.run_pause(run_id=run.run.pk)
    assert sweep_at(run, timezone.now() + timedelta(days=1)) == 0  # paused: not sent
    # w1 had a minute left when the run paused.
    Step.objects.filter(pk=run.step("w1").pk).update(
        next_run_at=timezone.now() + timedelta(minutes=1)
    )
    run.transport.steps.clear()

    with run.committed():
        services.run_resume(run_id=run.run.pk)
    with run.committed():
        assert control.resume(run.run.pk)

    assert countdowns(run).keys() == {"w1"}
    assert 0 < countdowns(run)["w1"] <= 61
    w0, w1 = run.step("w0"), run.step("w1")
    assert (w0.status, w0.asleep, w1.asleep) == ("pending", True, False)
    assert w0.next_run_at is not None
    assert sweep_at(run, w0.next_run_at - timedelta(seconds=10)) == 1
    assert countdowns(run)["w0"] == 10


def test_a_cancelled_run_leaves_nothing_for_the_wake_sweep(engine_run: Start) -> None:
    run = engine_run(waits({"for": "1h"}))
    run.park("w0", HOUR_MS)

    with run.committed():
        services.run_cancel(run_id=run.run.pk, reason="no more waiting")

    step = run.step("w0")
    assert (step.status, step.asleep, step.next_run_at) == ("cancelled", False, None)
    assert dispatch.asleep_next_due() is None
    assert sweep_at(run, timezone.now() + timedelta(days=400)) == 0


def test_the_lost_message_sweep_sends_a_step_whose_wake_never_came_once(
    engine_run: Start,
) -> None:
    run = engine_run(waits({"for": "1h"}))
    run.park("w0", HOUR_MS)
    step = run.step("w0")
    # The wake sweep never came (beat was down): the step is long past its time.
    long_ago = timezone.now() - timedelta(hours=2)
    Step.objects.filter(pk=step.pk).update(next_run_at=long_ago, dispatched_at=long_ago)
    run.transport.steps.clear()

    with run.committed():
        assert sweeps.redispatch_lost()["steps"] == 1

    assert run.step("w0").asleep is False
    assert sweep_at(run, timezone.now()) == 0  # sent once, by one sweep
    assert countdowns(run) == {"w0": 0.0}
