"""A parked step holds no place of its task's ``max_concurrent_steps``
(runs.admission.step_admission):
a wait on its timer or a step in a rate limit's line gives its place to the task's next
ready step as it parks, and takes one again when its wait ends, even past the limit.
In process, each step's attempt the worker's own (``orchestrator.executor``); the same
with a real worker: tests/integration/test_timers.py."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from orchestrator import executor
from ratelimits import selectors as limits
from ratelimits.models import RateLimit
from runs import services
from runs.models import Step, Task
from tests.runs.engine.harness import EngineRun

pytestmark = pytest.mark.django_db

Start = Callable[..., EngineRun]


def fan(*planned: dict[str, Any], limit: int | None = None) -> dict[str, Any]:
    task: dict[str, Any] = {"name": "t", "mode": "parallel", "steps": list(planned)}
    if limit is not None:
        task["max_concurrent_steps"] = limit
    return {"name": "fan", "agents": [{"name": "a", "tasks": [task]}]}


def wait(name: str) -> dict[str, Any]:
    return {"name": name, "tool": "wait", "params": {"for": "20s"}}


def noop(name: str) -> dict[str, Any]:
    return {"name": name, "tool": "noop"}


def execute(run: EngineRun, name: str) -> str:
    """One attempt of the step, as a worker executes its message (due now: a wait's
    timer or a line's moment is over when the test says)."""
    step = run.step(name)
    Step.objects.filter(pk=step.pk).update(next_run_at=None)
    with run.committed():
        return executor.execute_step(step.pk, worker="w", task_id=f"task-{name}")


def dispatched(run: EngineRun) -> list[str]:
    """The steps sent to workers so far (a parked step's wake-up is no dispatch)."""
    rows = Step.objects.filter(run=run.run, dispatched_at__isnull=False)
    return sorted(rows.values_list("name", flat=True))


def places_held(run: EngineRun) -> int:
    return Task.objects.get(run=run.run).active_children


def parked(run: EngineRun) -> list[str]:
    rows = Step.objects.filter(run=run.run, status="pending").exclude(waiting_reason="")
    return sorted(rows.values_list("name", flat=True))


def test_more_parked_waits_than_places_all_park_at_once(engine_run: Start) -> None:
    # The default limit, 3, for five waits of 20 s.
    run = engine_run(fan(*(wait(f"w{n}") for n in range(5))))
    assert dispatched(run) == ["w0", "w1", "w2"]

    for name in ("w0", "w1", "w2", "w3", "w4"):
        assert execute(run, name) == "waiting"

    # Each park gave its place to the next wait: all five were sent and wait at once.
    assert dispatched(run) == ["w0", "w1", "w2", "w3", "w4"]
    assert parked(run) == ["w0", "w1", "w2", "w3", "w4"]
    assert places_held(run) == 0
    for name in ("w3", "w0", "w4", "w1", "w2"):
        assert execute(run, name) == "completed"
    assert run.refresh().status == "completed"


def test_a_woken_wait_holds_a_place_until_it_completes(engine_run: Start) -> None:
    run = engine_run(fan(wait("w0"), wait("w1"), noop("n0"), noop("n1"), noop("n2"), limit=2))
    assert execute(run, "w0") == "waiting"
    assert execute(run, "w1") == "waiting"
    assert dispatched(run) == ["n0", "n1", "w0", "w1"]

    # w0 wakes and completes while n0 and n1 hold the two places: for that moment the
    # task holds three, and its completion frees none for n2.
    assert execute(run, "w0") == "completed"
    assert places_held(run) == 2
    assert "n2" not in dispatched(run)
    # Under its limit again, the task sends n2.
    assert execute(run, "n0") == "completed"
    assert "n2" in dispatched(run)
    for name in ("n1", "n2", "w1"):
        assert execute(run, name) == "completed"
    assert places_held(run) == 0
    assert run.refresh().status == "completed"


@pytest.fixture
def one_noop_per_minute() -> Iterator[RateLimit]:
    """An operators' limit on the `noop` tool: one a minute, the test's time frees none."""
    limit = RateLimit.objects.create(name="noop", tool="noop", limit=1, period_ms=60_000)
    limits.forget_tool_limits()
    yield limit
    limits.forget_tool_limits()


@pytest.mark.usefixtures("one_noop_per_minute")
def test_steps_in_a_rate_limits_line_hold_no_place_and_a_pause_gives_them_theirs(
    engine_run: Start,
) -> None:
    run = engine_run(fan(*(noop(f"s{n}") for n in range(4)), limit=2))
    assert execute(run, "s0") == "completed"  # the minute's one unit
    for name in ("s1", "s2", "s3"):
        assert execute(run, name) == "waiting"

    assert dispatched(run) == ["s0", "s1", "s2", "s3"]
    assert parked(run) == ["s1", "s2", "s3"]
    assert places_held(run) == 0

    # Paused, they leave the line; they ask again when the run resumes, as the steps
    # dispatched they are, each with its place.
    with run.committed():
        services.run_pause(run_id=run.run.pk)
    assert parked(run) == []
    assert places_held(run) == 3
