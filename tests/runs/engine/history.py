"""Runs' histories as a client reads them, driven in a fixed order and normalised for
their golden files (tests/runs/engine/test_history_golden.py).

``Driver`` plays a run through the engine in this process: each step's attempt is the
worker's own (``orchestrator.executor.execute_step``: the claim, a wait's timer, the
tool, the recording), in the order the test names, so the order of parallel steps is the
test's and never a race's. What a client does (approve, cancel, post to a callback URL)
goes through the API with the tenant's key; what the worker does on a run message (pick
a child run up, tell its parent it ended, answer a re-plan) is called here as its task
would.

``read`` lists a run's events through ``GET /api/v1/runs/{id}/events``, following the
``next`` links until there is none, and what the API shows of its steps and credits.
``Normaliser`` replaces only what must differ between two runs of the same story: ids
(by order of first appearance), times, the worker's process id and the URL a local
server was given; everything else (kinds, entities, statuses, actors, messages, payload
keys and values, and the order) is compared as it is."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

from rest_framework.test import APIClient

from orchestrator import executor
from runs.engine import control
from runs.engine.outcomes import Outcome, record
from runs.models import Run, Step
from runs.outbox import RunMessage
from runs.people import replanning
from runs.people.planners import planner_named
from runs.waits import children
from tests.runs.engine.harness import EngineRun, RecordingTransport

# The worker's name in the claims' events: ``execute_step`` adds its process id.
WORKER = "golden"
# Small pages: every history spans several, as a client follows them.
PAGE_SIZE = 7

_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_TIME = re.compile(r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:Z|[+-]\d{2}:?\d{2})?")
_LOCAL_URL = re.compile(r"http://127\.0\.0\.1:\d+")
# Payload keys whose values are rows' integer keys, and the rows' kind.
_ROW_KEYS = {"steps": "step", "ticket": "ticket"}


@dataclass
class Normaliser:
    """Stable placeholders for what differs between runs, shared by every run of one
    story (a child run's id in its parent's events is the child's placeholder)."""

    # Values that must not be shown as they are (an API key's prefix in an actor).
    secrets: dict[str, str] = field(default_factory=dict)
    names: dict[tuple[str, str], str] = field(default_factory=dict)
    pid: str = field(default_factory=lambda: str(os.getpid()))

    def name(self, kind: str, value: Any) -> str:
        key = (kind, str(value))
        if key not in self.names:
            count = sum(1 for known, _ in self.names if known == kind)
            self.names[key] = f"<{kind} {count + 1}>"
        return self.names[key]

    def text(self, value: str) -> str:
        value = _UUID.sub(lambda found: self.name("uuid", found.group()), value)
        value = _TIME.sub("<time>", value)
        value = _LOCAL_URL.sub("http://127.0.0.1:<port>", value)
        for secret, shown in self.secrets.items():
            value = value.replace(secret, shown)
        return value.replace(f"{WORKER}:{self.pid}", f"{WORKER}:<pid>")

    def value(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, list):
            return [self.value(item) for item in value]
        if isinstance(value, dict):
            # In key order: a JSON object's order is no part of it.
            return {key: self.field(key, value[key]) for key in sorted(value)}
        return value

    def field(self, key: str, value: Any) -> Any:
        # Rows named by their integer keys (the steps an approval decided, a ticket).
        kind = _ROW_KEYS.get(key)
        if kind is None or isinstance(value, int):  # a run's `created`: how many steps
            return self.value(value)
        if isinstance(value, list):
            return [self.name(kind, item) for item in value]
        return self.name(kind, value)

    def event(self, number: int, event: dict[str, Any]) -> dict[str, Any]:
        entity = event["entity"]
        entity_id = event["entity_id"]
        named = self.text(entity_id) if entity == "run" else self.name(entity, entity_id)
        shown = {key: self.value(item) for key, item in event.items()}
        return {
            **shown,
            "id": number,  # its place in the listing: the listing is in id order
            "entity_id": named,
            "created_at": "<time>",
        }

    def step(self, step: dict[str, Any]) -> dict[str, Any]:
        return {
            "step": self.name("step", step["id"]),
            "path": f"{step['agent_name']}.{step['task_name']}.{step['name']}",
            "generation": step["generation"],
            "status": step["status"],
            "attempts": step["attempts"],
            "failures": step["failures"],
            "cost": step["cost"],
        }


@dataclass(frozen=True)
class History:
    """One run as the API shows it: its events (every page), steps and credits."""

    run: dict[str, Any]
    events: list[dict[str, Any]]
    steps: list[dict[str, Any]]


def pages(client: APIClient, first: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    """Every result of a paginated list, following its ``next`` links to the end."""
    response = client.get(first, params)
    results: list[dict[str, Any]] = []
    while True:
        assert response.status_code == 200, response.content
        body = response.json()
        results += body["results"]
        if not body["next"]:
            return results
        response = client.get(body["next"])  # the link exactly as the API gave it


def read(client: APIClient, run_id: Any) -> History:
    base = f"/api/v1/runs/{run_id}"
    run = client.get(base)
    assert run.status_code == 200, run.content
    events = pages(client, f"{base}/events", {"page_size": PAGE_SIZE})
    steps = pages(client, f"{base}/steps", {"page_size": 100})
    return History(run.json(), events, steps)


def normalised(histories: list[History], secrets: dict[str, str]) -> dict[str, Any]:
    """The golden form of a story's runs (the first is the run the story started)."""
    names = Normaliser(secrets)
    runs = []
    for history in histories:
        run = history.run
        runs.append(
            {
                "run": names.text(run["id"]),
                "status": run["status"],
                "attempt_number": run["attempt_number"],
                "last_error": names.value(run["last_error"]),
                "credits": run["credits"],
                "steps": [names.step(step) for step in history.steps],
                "events": [
                    names.event(number, event)
                    for number, event in enumerate(history.events, start=1)
                ],
            }
        )
    return {"runs": runs}


def golden_text(golden: dict[str, Any]) -> str:
    """``normalised``'s form as JSON, one step or event a line (a diff shows which)."""
    lines = ["{", ' "runs": [']
    for number, run in enumerate(golden["runs"]):
        lines.append("  {")
        fields = list(run.items())
        for index, (key, value) in enumerate(fields):
            comma = "," if index < len(fields) - 1 else ""
            if isinstance(value, list):
                lines.append(f"   {json.dumps(key)}: [")
                lines += [
                    f"    {json.dumps(item)}{',' if i < len(value) - 1 else ''}"
                    for i, item in enumerate(value)
                ]
                lines.append(f"   ]{comma}")
            else:
                lines.append(f"   {json.dumps(key)}: {json.dumps(value)}{comma}")
        lines.append("  }" + ("," if number < len(golden["runs"]) - 1 else ""))
    lines += [" ]", "}"]
    return "\n".join(lines) + "\n"


class Driver:
    """A run of one story, its steps' attempts made by the worker's own code in the
    order the story names them."""

    def __init__(self, engine: EngineRun, client: APIClient) -> None:
        self.engine = engine
        self.client = client
        self.tasks = 0

    @property
    def run(self) -> Run:
        return self.engine.refresh()

    @property
    def transport(self) -> RecordingTransport:
        return self.engine.transport

    def committed(self) -> AbstractContextManager[Any]:
        return self.engine.committed()

    def step(self, path: str, run: Run | None = None) -> Step:
        """The latest step at ``agent.task.step`` (of ``run``, this one by default)."""
        agent, task, name = path.split(".", 2)
        found = (
            Step.objects.filter(
                run=run or self.engine.run, task__agent__name=agent, task__name=task, name=name
            )
            .order_by("-generation", "-pk")
            .first()
        )
        assert found is not None, f"no step {path}"
        return found

    def due(self, step: Step) -> None:
        """Time passes for ``step``: a retry's backoff or a wait's timer is over (the
        story says when, not the clock; the claim then lets it through)."""
        Step.objects.filter(pk=step.pk).update(next_run_at=None)

    def attempt(self, path: str, *, run: Run | None = None, expect: str = "completed") -> Step:
        """One attempt of the step at ``path``, as a worker executes its message."""
        step = self.step(path, run)
        self.due(step)
        self.tasks += 1
        with self.committed():
            done = executor.execute_step(step.pk, worker=WORKER, task_id=f"task-{self.tasks}")
        assert done == expect, f"{path}: {done}, not {expect}"
        return Step.objects.get(pk=step.pk)

    def attempt_as(self, path: str, outcome: Outcome) -> Step:
        """One attempt of the step at ``path`` whose tool answers ``outcome`` this time
        (a flaky tool's good day): the worker's claim and recording, the story's answer."""
        step = self.step(path)
        self.due(step)
        self.tasks += 1
        claimed = executor.claim(step.pk, f"{WORKER}:{os.getpid()}", f"task-{self.tasks}")
        assert claimed is not None, f"{path} could not be claimed"
        with self.committed():
            assert record(step.pk, step.run_id, claimed.attempts, outcome)
        return Step.objects.get(pk=step.pk)

    def claim(self, path: str) -> Step:
        """Claim the step at ``path`` as a worker would and leave its tool running."""
        step = self.step(path)
        self.tasks += 1
        claimed = executor.claim(step.pk, f"{WORKER}:{os.getpid()}", f"task-{self.tasks}")
        assert claimed is not None, f"{path} could not be claimed"
        return claimed

    def record_late(self, step: Step, outcome: Outcome) -> bool:
        """The result of an attempt ``claim`` left running, as its worker records it."""
        with self.committed():
            return record(step.pk, step.run_id, step.attempts, outcome)

    def post(self, route: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        """A client's POST to the run's ``route`` (``approve``, ``cancel``...)."""
        with self.committed():
            response = self.client.post(
                f"/api/v1/runs/{self.engine.run.pk}/{route}", body or {}, format="json"
            )
        assert response.status_code in (200, 202), response.content
        answer: dict[str, Any] = response.json()
        return answer

    # ------------------------------------------------------------ the worker's run tasks
    def pick_up(self, run: Run) -> None:
        """The worker's pick-up of ``run`` (a child run, on its own message)."""
        assert (RunMessage.PICK_UP, str(run.pk)) in self.transport.runs
        with self.committed():
            assert control.pick_up(run.pk)

    def child_ended(self, child: Run) -> None:
        """The worker's CHILD_ENDED message: the parent's waiting step is told."""
        assert (RunMessage.CHILD_ENDED, str(child.pk)) in self.transport.runs
        with self.committed():
            assert children.child_ended(child.pk)

    def replan(self, planner: Callable[[str], Any] = planner_named) -> str:
        """The worker's replan task, answering the re-plan the engine asked for."""
        assert self.engine.run_messages(RunMessage.REPLAN) == 1
        with self.committed():
            return replanning.replan_run(self.engine.run.pk, planner)
