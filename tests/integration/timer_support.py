"""Helpers for the tests of durable waits (the `wait` tool): plans of waits, when a
parked wait step is due to wake, and the step messages the broker holds."""

from __future__ import annotations

import base64
import json
from datetime import datetime
from typing import Any

from common.stores import broker_redis
from runs.admission.step_admission import TIMER
from runs.models import Run, Step
from runs.selectors import run_history
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
        run_history(step.run_id)
        .filter(entity="step", entity_id=str(step.pk), payload__has_key="timer")
        .order_by("-id")
        .values_list("payload", flat=True)
        .first()
    )
    assert payload is not None, f"step {step.pk} was never parked on a timer"
    return datetime.fromisoformat(payload["until"])


def step_messages(step: Step) -> list[str]:
    """The names of the tasks of every message the broker holds for ``step`` (its id the
    task's first argument): those queued (every list in the broker's Redis: its queues
    by priority) and those delivered to a worker and not yet acknowledged (the
    ``unacked`` hash, where a message with a countdown waits for its time)."""
    client = broker_redis(socket_timeout=5, socket_connect_timeout=5)
    payloads: list[bytes] = []
    for key in client.scan_iter(count=1000):
        if client.type(key) == b"list":
            payloads += client.lrange(key, 0, -1)
    payloads += [json.dumps(json.loads(value)[0]).encode() for value in client.hvals("unacked")]
    names = []
    for payload in payloads:
        message = json.loads(payload)
        if not isinstance(message, dict) or "body" not in message:
            continue  # not a Celery message
        body = json.loads(base64.b64decode(message["body"]))
        if not isinstance(body, list):
            continue  # a control message (a broadcast, its reply): a dict, no task's args
        args = body[0]
        if args and args[0] == step.pk:
            names.append(message["headers"]["task"])
    return names
