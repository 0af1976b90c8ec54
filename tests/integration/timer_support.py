"""Helpers for the tests of durable waits (the `wait` tool): plans of waits, and when a
parked wait step is due to wake."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from runs.models import Run, RunEvent, Step
from runs.step_admission import TIMER
from tests.support import wait_until


def waits_plan(count: int, seconds: float, *, then: int = 0) -> dict[str, Any]:
    """``count`` waits of ``seconds`` side by side, then ``then`` echo steps after them."""
    fan = {
        "name": "waits",
        "mode": "parallel",
        "max_concurrent_steps": count,
        "steps": [
            {"name": f"w{n}", "tool": "wait", "params": {"for": f"{seconds}s"}}
            for n in range(count)
        ],
    }
    after = {  # the agent's tasks run in sequence: after the waits
        "name": "after",
        "steps": [{"name": f"e{n}", "tool": "echo", "params": {"n": n}} for n in range(then)],
    }
    return {
        "name": "waits",
        "agents": [{"name": "a", "tasks": [fan, after] if then else [fan]}],
    }


def parked(run: Run, count: int, timeout: float = 30) -> list[Step]:
    """Wait until ``count`` of the run's steps are parked on their timers."""

    def found() -> list[Step] | None:
        steps = list(Step.objects.filter(run=run, status="pending", waiting_reason=TIMER))
        return steps if len(steps) == count else None

    return wait_until(found, timeout=timeout, what=f"{count} steps of {run.pk} on timers")


def wake_of(step: Step) -> datetime:
    """When the step's timer was set for, from its last park's event."""
    payload = (
        RunEvent.objects.filter(
            run_id=step.run_id, entity="step", entity_id=str(step.pk), payload__has_key="timer"
        )
        .order_by("-id")
        .values_list("payload", flat=True)
        .first()
    )
    assert payload is not None, f"step {step.pk} was never parked on a timer"
    return datetime.fromisoformat(payload["until"])
