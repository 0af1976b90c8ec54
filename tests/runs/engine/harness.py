"""Drive a run through the engine in this process, without a broker or a worker.

The engine's messages go to a recording transport instead of Celery: a test sees which
steps the engine sent, claims one as a worker would (the same conditional UPDATE), and
feeds the recording path the outcome it chooses. What the tool would have done is the
test's to decide; everything after it (charging, retries, failure modes, handlers,
propagation up the tree) is the real engine, in the test's transaction.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from billing.models import Organization
from common.tools.base import ToolError
from orchestrator import asks
from runs import services
from runs.admission import step_admission
from runs.engine import control
from runs.engine.outcomes import Outcome, record
from runs.engine.start import run_start
from runs.models import Run, Step
from runs.outbox import RunMessage, StepMessage
from runs.transitions import claim_step
from tests import factories

CaptureCallbacks = Callable[..., AbstractContextManager[Any]]


@dataclass
class RecordingTransport:
    """``runs.outbox.Transport`` that keeps what would have been published."""

    steps: list[StepMessage] = field(default_factory=list)
    runs: list[tuple[RunMessage, str]] = field(default_factory=list)
    revoked: list[str] = field(default_factory=list)
    # (organization or None, runner ids) per wake-up of held runner polls
    woken: list[tuple[str | None, list[str]]] = field(default_factory=list)
    # (wait id, number, countdown) per poll message
    polls: list[tuple[str, int, float]] = field(default_factory=list)

    def publish_steps(self, messages: Sequence[StepMessage]) -> None:
        self.steps.extend(messages)

    def publish_run(self, message: RunMessage, run_id: str, priority: int) -> None:
        self.runs.append((message, run_id))

    def revoke(self, task_ids: Sequence[str], runs: Mapping[str, int]) -> None:
        self.revoked.extend(task_ids)

    def wake_runners(self, organization_id: str | None, runner_ids: Sequence[str]) -> None:
        self.woken.append((organization_id, list(runner_ids)))

    def schedule_poll(self, wait_id: str, number: int, countdown_s: float) -> None:
        self.polls.append((wait_id, number, countdown_s))


def waits(*params: dict[str, Any], **plan: Any) -> dict[str, Any]:
    """A plan of side-by-side `wait` steps w0, w1, ... with these params (and ``plan``'s
    fields: `credits`, `timeouts`)."""
    steps = [{"name": f"w{n}", "tool": "wait", "params": p} for n, p in enumerate(params)]
    task = {"name": "t", "mode": "parallel", "max_concurrent_steps": len(steps), "steps": steps}
    return {"name": "waits", "agents": [{"name": "a", "tasks": [task]}], **plan}


class EngineRun:
    """One run, started and picked up; steps addressed by name."""

    def __init__(
        self,
        spec: dict[str, Any],
        transport: RecordingTransport,
        capture: CaptureCallbacks,
        organization: Organization | None = None,
    ) -> None:
        self.transport = transport
        self._capture = capture
        self.run = services.run_create(organization=organization or factories.org(), plan=spec)
        with self._committed():
            run_start(run_id=self.run.pk)
        with self._committed():
            assert control.pick_up(self.run.pk)
        self._claims = 0

    def _committed(self) -> AbstractContextManager[Any]:
        # The test's transaction never commits; run the after-commit publishing anyway.
        return self._capture(execute=True)

    # ------------------------------------------------------------------ reading
    def step(self, name: str) -> Step:
        """The current generation's step called ``name`` (the latest one)."""
        found = Step.objects.filter(run=self.run, name=name).order_by("-generation", "-pk").first()
        assert found is not None, f"no step {name!r}"
        return found

    def step_in(self, agent: str, name: str, task: str = "t") -> Step:
        """The latest step called ``name`` in ``agent``'s ``task`` (names repeat across
        agents)."""
        found = (
            Step.objects.filter(run=self.run, task__agent__name=agent, task__name=task, name=name)
            .order_by("-attempt_number", "-generation", "-pk")
            .first()
        )
        assert found is not None, f"no step {agent}.{task}.{name}"
        return found

    def statuses(self) -> dict[str, str]:
        """Every step of the current attempt and generation, by name."""
        run = self.refresh()
        rows = Step.objects.filter(run=run, attempt_number=run.attempt_number).order_by(
            "generation", "pk"
        )
        return {step.name: step.status for step in rows}  # the latest generation wins

    def refresh(self) -> Run:
        self.run = Run.objects.get(pk=self.run.pk)
        return self.run

    def sent(self) -> list[str]:
        """The names of the steps messages were published for, in order."""
        names = dict(Step.objects.filter(run=self.run).values_list("pk", "name"))
        return [names[message.step_id] for message in self.transport.steps]

    # ------------------------------------------------------------------ acting
    def finish(self, name: str, outcome: Outcome | None = None) -> Step:
        """Claim the step as a worker would and record ``outcome`` (success by default)."""
        return self.finish_step(self.step(name), outcome)

    def finish_step(self, step: Step, outcome: Outcome | None = None) -> Step:
        """``finish`` for a step row (any generation)."""
        name = step.name
        # A retry's delay has passed: the test decides when.
        Step.objects.filter(pk=step.pk).update(next_run_at=None)
        self._claims += 1
        claimed = claim_step(
            step.pk, worker="test", task_id=f"task-{self._claims}", lease_seconds=60
        )
        assert claimed is not None, f"step {name!r} could not be claimed ({step.status})"
        with self._committed():
            record(step.pk, self.run.pk, claimed["attempts"], outcome or Outcome(output={}))
        return Step.objects.get(pk=step.pk)

    def claim(self, name: str) -> int:
        """Claim the step as a worker would, and keep it running: its attempt's number
        (``record`` finishes it later)."""
        step = self.step(name)
        Step.objects.filter(pk=step.pk).update(next_run_at=None)
        self._claims += 1
        claimed = claim_step(
            step.pk, worker="test", task_id=f"task-{self._claims}", lease_seconds=60
        )
        assert claimed is not None, f"step {name!r} could not be claimed ({step.status})"
        return int(claimed["attempts"])

    def park(self, name: str, for_ms: int) -> step_admission.Admission:
        """Claim the wait step ``name`` as a worker would and ask its timer for ``for_ms``,
        as the executor does (it parks, giving its task's place to the next ready step,
        or is refused)."""
        attempt = self.claim(name)
        with self._committed():
            return asks.timer(self.step(name), attempt, None, for_ms)

    def record(self, name: str, attempt: int, outcome: Outcome | None = None) -> Step:
        """Record the outcome of an attempt ``claim`` made."""
        step = self.step(name)
        with self._committed():
            record(step.pk, self.run.pk, attempt, outcome or Outcome(output={}))
        return Step.objects.get(pk=step.pk)

    def committed(self) -> AbstractContextManager[Any]:
        """Run what a block publishes after commit, as the worker's transaction would."""
        return self._committed()

    def run_messages(self, kind: RunMessage) -> int:
        """How many ``kind`` messages were published for this run."""
        return sum(
            1 for sent, run_id in self.transport.runs if sent == kind and run_id == str(self.run.pk)
        )

    @staticmethod
    def failure(code: str, message: str = "failed", *, retryable: bool = False) -> Outcome:
        """A failed attempt's outcome, charged as a failed attempt is."""
        return Outcome(error=ToolError(code, message, retryable), cost=Decimal("0.01"))

    def fail(self, name: str, code: str = "tool_error", *, retryable: bool = False) -> Step:
        error = ToolError(code, f"{name} failed", retryable)
        return self.finish(name, Outcome(error=error, cost=Decimal("0.01")))
