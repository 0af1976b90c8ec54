"""Following a run as it goes: progress overall and per agent, and failures as they happen.

Each ``RunWatcher.poll()`` reads, in this order:

1. the run (``GET runs/{id}``): status, attempt, overall progress;
2. its tasks (``GET runs/{id}/tasks``, the current attempt): each task's ``step_count``,
   summed by agent, is that agent's total (few rows: a run has far fewer tasks than steps);
3. its events after the last one seen (``GET runs/{id}/events?after=``, by cursor): each
   step reaching a terminal status counts towards its agent (the first segment of the
   event's ``path``), an agent's transitions give its status, and a step that fails
   (for good, or an attempt that will be retried) is reported once, with its path, attempt
   and error code.

The run is read first, so when it is terminal the events read after it include every
event up to its end: that update is the last (``done``). Counting from events costs one
small request a poll whatever the run's size, where reading its steps would cost one per
500 steps.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from orchestrator_client.types import (
    STATUS_ONLY,
    STEP_TERMINAL_STATUSES,
    TERMINAL_STATUSES,
    Event,
    RunDetail,
)

if TYPE_CHECKING:
    from orchestrator_client.resources.runs import Runs


@dataclass
class AgentProgress:
    name: str
    status: str = "pending"
    steps_total: int = 0
    steps_finished: int = 0


@dataclass(frozen=True)
class Failure:
    """A step attempt that failed: for good (``final``) or to be retried."""

    path: str
    step_id: str
    attempt: int | None
    code: str
    message: str
    final: bool
    event: Event

    @classmethod
    def from_event(cls, event: Event, attempt: int | None = None) -> Failure | None:
        """The failure an event records, if it records one; ``attempt`` is the step's
        (``StepAttempts``)."""
        if event["entity"] != "step":
            return None
        payload: Any = event["payload"] if isinstance(event["payload"], dict) else {}
        final = event["to_status"] == "failed"
        retried = (event["from_status"], event["to_status"]) == ("running", "pending")
        if not (final or (retried and "code" in payload)):
            return None
        return cls(
            path=event["path"] or f"step {event['entity_id']}",
            step_id=event["entity_id"],
            attempt=attempt,
            code=str(payload.get("code") or "error"),
            message=str(payload.get("message") or event["message"]),
            final=final,
            event=event,
        )


class StepAttempts:
    """Which attempt each step is on, learnt from the events of a run in order.

    A step's start (pending -> running) and a retry's event carry the attempt in
    ``payload["attempt"]``; its other transitions (completed, failed...) do not, and
    belong to the attempt it last started."""

    def __init__(self) -> None:
        self._by_step: dict[str, int] = {}

    def see(self, event: Event) -> int | None:
        """The attempt ``event`` is about (None: not a step's, or not known)."""
        if event["entity"] != "step":
            return None
        payload = event["payload"] if isinstance(event["payload"], dict) else {}
        attempt = payload.get("attempt")
        if isinstance(attempt, int) and not isinstance(attempt, bool):
            self._by_step[event["entity_id"]] = attempt
            return attempt
        return self._by_step.get(event["entity_id"])


@dataclass(frozen=True)
class Approval:
    """A step that began waiting for a person (``orch runs approve``)."""

    path: str
    step_id: int


@dataclass
class WatchUpdate:
    run: RunDetail
    agents: list[AgentProgress]
    events: list[Event] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    approvals: list[Approval] = field(default_factory=list)
    done: bool = False


class RunWatcher:
    """Iterate for updates until the run has ended; ``interval`` seconds between polls."""

    def __init__(self, client: Runs, run_id: str, *, interval: float = 1.0) -> None:
        self.client = client
        self.run_id = run_id
        self.interval = interval
        self._last_event: int | None = None
        self._attempt = 0
        self._agents: dict[str, AgentProgress] = {}
        self._finished: dict[str, set[str]] = {}  # agent -> ids of its finished steps
        self._step_attempts = StepAttempts()

    def poll(self) -> WatchUpdate:
        run = self.client.get_run(self.run_id, exclude=STATUS_ONLY)
        self._follow_attempt(run["attempt_number"])
        self._read_totals(run)
        events = list(self.client.events(self.run_id, after=self._last_event, page_size=500))
        failures: list[Failure] = []
        approvals: list[Approval] = []
        for event in events:
            self._last_event = event["id"]
            step_attempt = self._step_attempts.see(event)
            # The run may have moved on to a new attempt since it was read.
            self._follow_attempt(event["attempt_number"])
            if event["attempt_number"] < self._attempt:
                continue  # an earlier attempt's history
            self._count(event)
            failure = Failure.from_event(event, step_attempt)
            if failure is not None:
                failures.append(failure)
            if event["entity"] == "step" and event["to_status"] == "waiting_approval":
                approvals.append(Approval(event["path"], int(event["entity_id"])))
        return WatchUpdate(
            run=run,
            agents=list(self._agents.values()),
            events=events,
            failures=failures,
            approvals=approvals,
            done=run["status"] in TERMINAL_STATUSES,
        )

    def __iter__(self) -> Iterator[WatchUpdate]:
        while True:
            update = self.poll()
            yield update
            if update.done:
                return
            self.client._sleep(self.interval)

    def _agent(self, name: str) -> AgentProgress:
        if name not in self._agents:
            self._agents[name] = AgentProgress(name)
            self._finished[name] = set()
        return self._agents[name]

    def _follow_attempt(self, attempt: int) -> None:
        """A later attempt has agents, tasks and steps of its own: count afresh."""
        if attempt > self._attempt:
            self._attempt = attempt
            self._agents, self._finished = {}, {}

    def _read_totals(self, run: RunDetail) -> None:
        if not sum(run["counts"]["tasks"].values()):
            return  # not picked up yet: no tasks
        totals: dict[str, int] = {}
        for task in self.client.tasks(self.run_id, page_size=500):  # the current attempt's
            totals[task["agent_name"]] = totals.get(task["agent_name"], 0) + task["step_count"]
        for name, total in totals.items():
            self._agent(name).steps_total = total

    def _count(self, event: Event) -> None:
        path = event["path"]
        if not path:
            return
        agent = self._agent(path.split(".", 1)[0])
        if event["entity"] == "agent" and event["to_status"]:
            agent.status = event["to_status"]
        elif event["entity"] == "step" and event["to_status"] in STEP_TERMINAL_STATUSES:
            finished = self._finished[agent.name]
            finished.add(event["entity_id"])
            agent.steps_finished = len(finished)
