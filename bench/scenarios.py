"""The measured scenarios: engine runs and their raw Celery counterparts.

Each scenario returns a ``Sample``: its wall time, or why it failed. Nothing raises out
of a scenario: a failure (a run that did not complete, a timeout, a RecursionError in
Celery's canvas) is a figure too.

Engine wall time runs from the ``run_start`` call (the plan is validated and stored
before, by ``run_create``, as an API request would) until the run's status, polled
from PostgreSQL every 10 ms, is terminal. Raw wall time runs from ``apply_async`` until
the last result is in (the canvas is built before).
"""

from __future__ import annotations

import contextlib
import random
import statistics
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from celery import chain, chord, group
from celery.canvas import Signature
from celery.exceptions import TimeoutError as CeleryTimeout
from django.utils import timezone

from billing.models import Organization
from billing.services import credits_grant, organization_create
from config.celery import app
from runs import services
from runs.models import Run, Step
from runs.states import RUN_TERMINAL, RunStatus, StepStatus

from .raw_tasks import BENCH_QUEUE, join, noop, stamp

POLL_S = 0.01
LATENCY_SAMPLES = 10


@dataclass(frozen=True)
class Sample:
    """One execution of one scenario: ``wall_s``, or ``error`` if it failed."""

    steps: int
    wall_s: float | None = None
    error: str | None = None


class ScenarioFailed(Exception):
    pass


def _describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    if isinstance(exc, ScenarioFailed):
        return first
    return f"{type(exc).__name__}: {first[:160]}" if first else type(exc).__name__


# --------------------------------------------------------------------------- plans
def _noop(name: str) -> dict[str, Any]:
    return {"name": name, "tool": "noop"}


def sequential_plan(steps: int) -> dict[str, Any]:
    """One agent, one task, ``steps`` no-op steps one after another."""
    return {
        "name": f"bench-seq-{steps}",
        "agents": [
            {
                "name": "agent",
                "mode": "sequential",
                "tasks": [
                    {
                        "name": "task",
                        "mode": "sequential",
                        "steps": [_noop(f"s{i}") for i in range(steps)],
                    }
                ],
            }
        ],
    }


def fan_plan(width: int) -> dict[str, Any]:
    """``width`` parallel no-op steps, all allowed at once, then one join step."""
    return {
        "name": f"bench-fan-{width}",
        "agents": [
            {
                "name": "agent",
                "mode": "sequential",
                "tasks": [
                    {
                        "name": "fan",
                        "mode": "parallel",
                        "max_concurrent_steps": width,
                        "steps": [_noop(f"s{i}") for i in range(width)],
                    },
                    {"name": "join", "steps": [_noop("join")]},
                ],
            }
        ],
    }


def dag_edges(nodes: int, seed: int = 42, fan_in: int = 3) -> list[list[int]]:
    """For each node, up to ``fan_in`` distinct earlier nodes: acyclic by construction."""
    rng = random.Random(seed)  # noqa: S311 - a reproducible graph, not a secret
    return [sorted(rng.sample(range(i), min(fan_in, i))) for i in range(nodes)]


def dag_plan(nodes: int, seed: int = 42) -> dict[str, Any]:
    """One agent in dag mode: ``nodes`` one-step tasks wired by ``dag_edges``."""
    tasks: list[dict[str, Any]] = []
    for i, deps in enumerate(dag_edges(nodes, seed)):
        task: dict[str, Any] = {"name": f"t{i}", "steps": [_noop("s")]}
        if deps:
            task["depends_on"] = [f"t{d}" for d in deps]
        tasks.append(task)
    return {
        "name": f"bench-dag-{nodes}",
        "agents": [{"name": "agent", "mode": "dag", "max_concurrent_tasks": nodes, "tasks": tasks}],
    }


# --------------------------------------------------------------------------- engine
class Engine:
    """Submits plans on behalf of one organization with credits to spare.

    ``alive`` says whether the worker still runs: every wait gives up when it does not.
    """

    def __init__(self, timeout: float, alive: Callable[[], bool]) -> None:
        self.timeout = timeout
        self.alive = alive
        self.organization: Organization = organization_create(name=f"bench-{uuid.uuid4().hex[:8]}")
        credits_grant(organization=self.organization, amount=10_000_000, reason="benchmark")

    def _create(self, spec: dict[str, Any]) -> Run:
        return services.run_create(organization=self.organization, plan=spec, actor="bench")

    def _wait_terminal(self, run: Run, started: float) -> str:
        while True:
            status = Run.objects.filter(pk=run.pk).values_list("status", flat=True).get()
            if status in RUN_TERMINAL:
                return status
            if time.perf_counter() - started > self.timeout:
                self._cancel(run)
                raise ScenarioFailed(f"timed out after {self.timeout:g}s (run {status})")
            if not self.alive():
                raise ScenarioFailed(f"the worker died (run {status})")
            time.sleep(POLL_S)

    def _cancel(self, run: Run) -> None:
        with contextlib.suppress(Exception):
            services.run_cancel(run_id=run.pk, reason="benchmark timeout", actor="bench")

    def _check_completed(self, run: Run, status: str, steps: int) -> None:
        if status != RunStatus.COMPLETED:
            error = Run.objects.filter(pk=run.pk).values_list("last_error", flat=True).get()
            detail = f": {error}" if error else ""
            raise ScenarioFailed(f"run {run.pk} ended {status}{detail}")
        done = Step.objects.filter(run=run, status=StepStatus.COMPLETED).count()
        if done != steps:
            raise ScenarioFailed(f"run completed with {done} of {steps} steps completed")

    def run(self, spec: dict[str, Any], steps: int) -> Sample:
        """Submit ``spec`` and time it from ``run_start`` to a terminal status."""
        try:
            run = self._create(spec)
            started = time.perf_counter()
            services.run_start(run_id=run.pk, actor="bench")
            status = self._wait_terminal(run, started)
            wall = time.perf_counter() - started
            self._check_completed(run, status, steps)
            return Sample(steps, wall_s=wall)
        except Exception as exc:  # noqa: BLE001 - a failure is a figure too
            return Sample(steps, error=_describe(exc))

    def start_latency(self, samples: int = LATENCY_SAMPLES) -> Sample:
        """Median time from ``run_start`` to the first step's ``started_at`` (1-step runs).

        ``started_at`` is PostgreSQL's clock at the claim, on the same host as ours, so
        the figure is not rounded to the 10 ms poll.
        """
        latencies: list[float] = []
        try:
            for _ in range(samples):
                run = self._create(sequential_plan(1))
                started = time.perf_counter()
                sent: datetime = timezone.now()
                services.run_start(run_id=run.pk, actor="bench")
                first = self._first_step_started(run, started)
                latencies.append((first - sent).total_seconds())
                self._check_completed(run, self._wait_terminal(run, started), 1)
        except Exception as exc:  # noqa: BLE001 - a failure is a figure too
            return Sample(1, error=_describe(exc))
        return Sample(1, wall_s=statistics.median(latencies))

    def _first_step_started(self, run: Run, started: float) -> datetime:
        while True:
            first = (
                Step.objects.filter(run=run, started_at__isnull=False)
                .order_by("started_at")
                .values_list("started_at", flat=True)
                .first()
            )
            if first is not None:
                return first
            if time.perf_counter() - started > self.timeout:
                self._cancel(run)
                raise ScenarioFailed(f"no step started within {self.timeout:g}s")
            if not self.alive():
                raise ScenarioFailed("the worker died (no step started)")
            time.sleep(POLL_S)


# --------------------------------------------------------------------------- raw Celery
class Raw:
    """Celery canvas on the ``bench`` queue, results through the Redis result backend."""

    def __init__(self, timeout: float, alive: Callable[[], bool]) -> None:
        self.timeout = timeout
        self.alive = alive

    def _get(self, result: Any) -> Any:
        """``result.get()``, in slices of at most 2 s so that a dead worker is noticed."""
        deadline = time.perf_counter() + self.timeout
        while True:
            left = deadline - time.perf_counter()
            try:
                return result.get(timeout=max(0.05, min(2.0, left)), interval=POLL_S)
            except CeleryTimeout:
                if time.perf_counter() >= deadline:
                    raise
                if not self.alive():
                    raise ScenarioFailed("the worker died") from None

    def _noops(self, count: int) -> list[Signature[Any]]:
        return [noop.si() for _ in range(count)]

    def _timed(
        self, steps: int, build: Callable[[], Any], expect: Callable[[Any], bool] | None = None
    ) -> Sample:
        try:
            canvas = build()
            started = time.perf_counter()
            result = canvas.apply_async()
            value = self._get(result)
            wall = time.perf_counter() - started
            if expect is not None and not expect(value):
                raise ScenarioFailed(f"unexpected result {value!r:.80}")
        except CeleryTimeout:
            self._purge()
            return Sample(steps, error=f"timed out after {self.timeout:g}s")
        except Exception as exc:  # noqa: BLE001 - RecursionError and the like: a figure too
            self._purge()
            return Sample(steps, error=_describe(exc))
        return Sample(steps, wall_s=wall)

    def chain(self, links: int) -> Sample:
        return self._timed(links, lambda: chain(*self._noops(links)))

    def group(self, width: int) -> Sample:
        return self._timed(
            width, lambda: group(self._noops(width)), lambda value: len(value) == width
        )

    def chord(self, width: int) -> Sample:
        return self._timed(
            width + 1, lambda: chord(self._noops(width), join.s()), lambda value: value == width
        )

    def start_latency(self, samples: int = LATENCY_SAMPLES) -> Sample:
        """Median time from ``apply_async`` to the task starting (its own clock)."""
        latencies: list[float] = []
        try:
            for _ in range(samples):
                sent = time.time()
                began = self._get(stamp.apply_async())
                latencies.append(float(began) - sent)
        except Exception as exc:  # noqa: BLE001 - a failure is a figure too
            self._purge()
            return Sample(1, error=_describe(exc))
        return Sample(1, wall_s=statistics.median(latencies))

    def _purge(self) -> None:
        """Drop what a failed scenario left queued, so that it does not slow the next."""
        with contextlib.suppress(Exception), app.connection_for_write() as connection:
            channel: Any = connection.default_channel  # kombu's Redis channel
            channel.queue_purge(BENCH_QUEUE)
