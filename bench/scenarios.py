"""The measured scenarios: engine runs and their raw Celery counterparts.

Each scenario returns a ``Sample``: its wall time, or why it failed. Nothing raises out
of a scenario: a failure (a run that did not complete, a timeout, a RecursionError in
Celery's canvas) is a figure too.

Engine wall time runs from the ``run_start`` call (the plan is validated and stored
before, by ``run_create``, as an API request would) until the run's status, polled
from PostgreSQL every 10 ms, is terminal. Raw wall time runs from ``apply_async`` until
the last result is in (the canvas is built before).

A scenario may report more than its wall time in ``Sample.extra`` (runs/s, latency
percentiles): ``bench.report`` prints them under the table and writes them to the JSON.
"""

from __future__ import annotations

import contextlib
import random
import statistics
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from celery import chain, chord, group
from celery.canvas import Signature
from celery.exceptions import TimeoutError as CeleryTimeout
from django.db.models import Count
from django.utils import timezone

from billing.models import Organization
from billing.services import credits_grant, organization_create
from config.celery import app
from runs import services
from runs.engine.start import run_start
from runs.models import Run, Step
from runs.states import RUN_TERMINAL, RunStatus, StepStatus

from .raw_tasks import BENCH_QUEUE, join, noop, sleep, stamp

POLL_S = 0.01
# many_runs: one COUNT over 500 ids per poll. Latencies come from completed_at, not from
# the poll, and 50 ms is 0.1% of a wall of ~1 minute: less frequent, less to compete with
# the worker for the CPUs.
MANY_POLL_S = 0.05
LATENCY_SAMPLES = 10
MANY_RUNS = 500  # many_runs / many_chains: this many runs (chains) submitted at once
MANY_STEPS = 5  # of this many sequential no-op steps (links) each
# fan_20000: 20,000 steps, the most a run may have (PLAN_MAX_STEPS_PER_RUN, default
# 20,000), so 19,999 parallel steps and the join; at most 5,000 of them per task
# (PLAN_MAX_STEPS_PER_TASK; a task's max_concurrent_steps stops at 10,000 anyway).
WIDE_FAN_WIDTH = 19_999
WIDE_FAN_PER_TASK = 5_000
# noisy_neighbour: B's small run starts this long after A's fan-out; its time alone is
# the median of this many runs.
NOISY_DELAY_S = 1.0
NOISY_EVERY_S = 3.0
NOISY_SMALL_STEPS = 5
NOISY_IDLE_SAMPLES = 5
NOISY_BESIDE_SAMPLES = 5
# fan_sleep / group_sleep: this many steps (tasks) that each sleep this long, so that a
# run's parallelism, not the engine's cost per step, is what is measured; efficiency =
# the ideal wall (width x seconds / the fleet's worker slots) / the measured wall.
SLEEP_WIDTH = 2_000
SLEEP_S = 0.05


@dataclass(frozen=True)
class Sample:
    """One execution of one scenario: ``wall_s``, or ``error`` if it failed.

    ``extra``: further figures of a successful execution, by name (``runs_per_s``,
    ``p50_latency_s``, ``p95_latency_s``), reported as medians over the repetitions.
    """

    steps: int
    wall_s: float | None = None
    error: str | None = None
    extra: dict[str, float] = field(default_factory=dict)


class ScenarioFailed(Exception):
    pass


def _describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    if isinstance(exc, ScenarioFailed):
        return first
    return f"{type(exc).__name__}: {first[:160]}" if first else type(exc).__name__


def percentile(values: list[float], q: int) -> float:
    """The ``q``-th percentile (1-99) of ``values``, linear between the closest ranks."""
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def _many_extra(
    count: int, wall: float, submitted: float, latencies: list[float]
) -> dict[str, float]:
    return {
        "runs_per_s": count / wall,
        "submit_s": submitted,
        "p50_latency_s": percentile(latencies, 50),
        "p95_latency_s": percentile(latencies, 95),
    }


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


def sleep_fan_plan(width: int = SLEEP_WIDTH, seconds: float = SLEEP_S) -> dict[str, Any]:
    """``fan_plan`` whose parallel steps each sleep ``seconds`` (the ``sleep`` tool)."""
    plan = fan_plan(width)
    plan["name"] = f"bench-fan-sleep-{width}"
    plan["agents"][0]["tasks"][0]["steps"] = [
        {"name": f"s{i}", "tool": "sleep", "params": {"seconds": seconds}} for i in range(width)
    ]
    return plan


def efficiency(width: int, seconds: float, slots: int, wall: float) -> float:
    """The ideal wall of ``width`` sleeps of ``seconds`` on ``slots`` worker slots, over
    the measured one: 1.0 when every slot sleeps all the time."""
    return width * seconds / slots / wall if wall > 0 else 0.0


def wide_fan_plan(width: int, per_task: int = WIDE_FAN_PER_TASK) -> dict[str, Any]:
    """``width`` parallel no-op steps, all allowed at once, then one join step: the
    fan of ``fan_plan`` split into parallel tasks of at most ``per_task`` steps (the
    plan limits refuse a task of more than 5,000 steps, or a ``max_concurrent_steps``
    above 10,000), which a dag agent runs at once; the join task depends on them all.
    """
    tasks: list[dict[str, Any]] = []
    for index, first in enumerate(range(0, width, per_task)):
        size = min(per_task, width - first)
        tasks.append(
            {
                "name": f"fan{index}",
                "mode": "parallel",
                "max_concurrent_steps": size,
                "steps": [_noop(f"s{i}") for i in range(first, first + size)],
            }
        )
    fans = [task["name"] for task in tasks]
    tasks.append({"name": "join", "depends_on": fans, "steps": [_noop("join")]})
    return {
        "name": f"bench-wide-fan-{width}",
        "agents": [
            {"name": "agent", "mode": "dag", "max_concurrent_tasks": len(tasks), "tasks": tasks}
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

    def __init__(self, timeout: float, alive: Callable[[], bool], slots: int = 1) -> None:
        self.timeout = timeout
        self.alive = alive
        self.slots = slots  # the fleet's worker slots (prefork children): for efficiency
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
            run_start(run_id=run.pk, actor="bench")
            status = self._wait_terminal(run, started)
            wall = time.perf_counter() - started
            self._check_completed(run, status, steps)
            return Sample(steps, wall_s=wall)
        except Exception as exc:  # noqa: BLE001 - a failure is a figure too
            return Sample(steps, error=_describe(exc))

    def fan_sleep(self, width: int = SLEEP_WIDTH, seconds: float = SLEEP_S) -> Sample:
        """``width`` parallel steps sleeping ``seconds`` each, and a join: how much of the
        fleet one run uses (``efficiency``)."""
        sample = self.run(sleep_fan_plan(width, seconds), width + 1)
        if sample.wall_s is None:
            return sample
        extra = {"efficiency": efficiency(width, seconds, self.slots, sample.wall_s)}
        return Sample(sample.steps, wall_s=sample.wall_s, extra=extra)

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
                run_start(run_id=run.pk, actor="bench")
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

    def many_runs(self, runs: int = MANY_RUNS, steps: int = MANY_STEPS) -> Sample:
        """``runs`` runs of ``steps`` sequential no-op steps, submitted at once.

        All runs are created first (``run_create``, untimed); the clock starts before
        the first ``run_start``, which are called one after another as fast as they
        return (how long that takes is ``submit_s``). Wall time ends when one COUNT of
        the runs not yet terminal, polled every 50 ms, reads 0. A run's latency runs
        from ``timezone.now()`` just before its own ``run_start`` to its
        ``completed_at`` (the worker's clock, the same host's).
        """
        try:
            created = [self._create(sequential_plan(steps)) for _ in range(runs)]
            ids = [run.pk for run in created]
            sent: dict[Any, datetime] = {}
            started = time.perf_counter()
            for run in created:
                sent[run.pk] = timezone.now()
                run_start(run_id=run.pk, actor="bench")
            submitted = time.perf_counter() - started
            self._wait_all_terminal(ids, started)
            wall = time.perf_counter() - started
            finished = self._check_all_completed(ids, steps)
            latencies = [(finished[pk] - sent[pk]).total_seconds() for pk in ids]
        except Exception as exc:  # noqa: BLE001 - a failure is a figure too
            return Sample(runs * steps, error=_describe(exc))
        extra = _many_extra(runs, wall, submitted, latencies)
        return Sample(runs * steps, wall_s=wall, extra=extra)

    def _wait_all_terminal(self, ids: list[Any], started: float) -> None:
        pending = Run.objects.filter(pk__in=ids).exclude(status__in=RUN_TERMINAL)
        while True:
            left = pending.count()
            if not left:
                return
            if time.perf_counter() - started > self.timeout:
                for pk in pending.values_list("pk", flat=True):
                    with contextlib.suppress(Exception):
                        services.run_cancel(run_id=pk, reason="benchmark timeout", actor="bench")
                raise ScenarioFailed(
                    f"timed out after {self.timeout:g}s ({left} of {len(ids)} runs not terminal)"
                )
            if not self.alive():
                raise ScenarioFailed(f"the worker died ({left} of {len(ids)} runs not terminal)")
            time.sleep(MANY_POLL_S)

    def _check_all_completed(self, ids: list[Any], steps: int) -> dict[Any, datetime]:
        """Every run COMPLETED with ``steps`` completed steps: their ``completed_at``."""
        rows = Run.objects.filter(pk__in=ids).values_list("pk", "status", "completed_at")
        finished = {pk: at for pk, status, at in rows if status == RunStatus.COMPLETED and at}
        if len(finished) != len(ids):
            failed = next(pk for pk in ids if pk not in finished)
            run = Run.objects.filter(pk=failed).values_list("status", "last_error").get()
            detail = f": {run[1]}" if run[1] else ""
            raise ScenarioFailed(
                f"{len(ids) - len(finished)} of {len(ids)} runs did not complete "
                f"(run {failed} ended {run[0]}{detail})"
            )
        done = dict(
            Step.objects.filter(run_id__in=ids, status=StepStatus.COMPLETED)
            .values("run_id")
            .annotate(done=Count("pk"))
            .values_list("run_id", "done")
        )
        short = [pk for pk in ids if done.get(pk, 0) != steps]
        if short:
            raise ScenarioFailed(
                f"{len(short)} of {len(ids)} runs completed without {steps} completed steps "
                f"(run {short[0]}: {done.get(short[0], 0)})"
            )
        return finished

    # ------------------------------------------------------------------ noisy neighbour
    def noisy_neighbour(
        self, width: int = WIDE_FAN_WIDTH, small_steps: int = NOISY_SMALL_STEPS
    ) -> Sample:
        """Organization A starts a ``width``-step fan-out (and its join); one second into
        its execution organization B starts a run of ``small_steps`` sequential no-op
        steps, and again every NOISY_EVERY_S while A runs (NOISY_BESIDE_SAMPLES at most).

        Wall time is A's. Further figures: B's run on an idle system (the median of
        NOISY_IDLE_SAMPLES) and beside A (the median, and the worst), their ratio; A's
        fan-out alone (after the one beside B), and beside B over alone (A's throughput).
        B's times are PostgreSQL's (run_start -> completed_at), not the 10 ms poll's."""
        steps = width + 1
        try:
            small = Engine(self.timeout, self.alive)
            b_idle = statistics.median(
                small.timed_by_the_database(sequential_plan(small_steps), small_steps)
                for _ in range(NOISY_IDLE_SAMPLES)
            )
            # A first fan-out in a new database is slower than the next (the step table
            # grows from nothing under plans made for it small): one untimed first, so
            # that A beside B and A alone, after it, are measured alike.
            self._wide(width, steps)
            run = self._create(wide_fan_plan(width))
            started = time.perf_counter()
            run_start(run_id=run.pk, actor="bench")
            # One second into A's execution (its pick-up materialises 20,000 steps first,
            # with a worker child to spare), then every NOISY_EVERY_S while A runs.
            self._first_step_started(run, started)
            _analyze()
            besides: list[float] = []
            while len(besides) < NOISY_BESIDE_SAMPLES:
                time.sleep(NOISY_DELAY_S if not besides else NOISY_EVERY_S)
                if Run.objects.filter(pk=run.pk, status__in=RUN_TERMINAL).exists():
                    break
                besides.append(
                    small.timed_by_the_database(sequential_plan(small_steps), small_steps)
                )
            if not besides:
                raise ScenarioFailed("A ended before B could start beside it")
            status = self._wait_terminal(run, started)
            a_wall = time.perf_counter() - started
            self._check_completed(run, status, steps)
            alone = self._wide(width, steps)
        except Exception as exc:  # noqa: BLE001 - a failure is a figure too
            return Sample(steps, error=_describe(exc))
        b_beside = statistics.median(besides)
        extra = {
            "b_idle_s": b_idle,
            "b_beside_s": b_beside,
            "b_worst_s": max(besides),
            "b_ratio": b_beside / b_idle if b_idle else 0.0,
            "a_alone_s": alone,
            "a_ratio": a_wall / alone,
        }
        return Sample(steps, wall_s=a_wall, extra=extra)

    def timed_by_the_database(self, spec: dict[str, Any], steps: int) -> float:
        """Seconds from ``run_start`` to the run's ``completed_at`` (PostgreSQL's clock, on
        this host): a small run's time, not rounded up to the 10 ms poll."""
        run = self._create(spec)
        started = time.perf_counter()
        sent: datetime = timezone.now()
        run_start(run_id=run.pk, actor="bench")
        self._check_completed(run, self._wait_terminal(run, started), steps)
        completed = Run.objects.values_list("completed_at", flat=True).get(pk=run.pk)
        if completed is None:
            raise ScenarioFailed(f"run {run.pk} completed without a completed_at")
        return (completed - sent).total_seconds()

    def _wide(self, width: int, steps: int) -> float:
        """A's fan-out alone: its wall time."""
        run = self._create(wide_fan_plan(width))
        started = time.perf_counter()
        run_start(run_id=run.pk, actor="bench")
        self._first_step_started(run, started)
        _analyze()
        status = self._wait_terminal(run, started)
        wall = time.perf_counter() - started
        self._check_completed(run, status, steps)
        return wall


def _analyze() -> None:
    """Statistics as autovacuum would soon have them once A's 20,000 steps are in (a
    running server's, as bench.run.analyze says): plans made for the step table before
    them, when it held a few hundred rows, doubled A's time on its first run."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("ANALYZE runs_step, runs_task, runs_runevent")


# --------------------------------------------------------------------------- raw Celery
class Raw:
    """Celery canvas on the ``bench`` queue, results through the Redis result backend."""

    def __init__(self, timeout: float, alive: Callable[[], bool], slots: int = 1) -> None:
        self.timeout = timeout
        self.alive = alive
        self.slots = slots

    def _get(self, result: Any, deadline: float | None = None) -> Any:
        """``result.get()``, in slices of at most 2 s so that a dead worker is noticed.

        ``deadline`` (``time.perf_counter()``): when to give up; default ``timeout`` on.
        """
        if deadline is None:
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

    def group_sleep(self, width: int = SLEEP_WIDTH, seconds: float = SLEEP_S) -> Sample:
        """A group of ``width`` tasks sleeping ``seconds`` each (``fan_sleep``'s raw twin,
        without a join: a group's own best case)."""
        sample = self._timed(
            width,
            lambda: group(sleep.si(seconds) for _ in range(width)),
            lambda value: len(value) == width,
        )
        if sample.wall_s is None:
            return sample
        extra = {"efficiency": efficiency(width, seconds, self.slots, sample.wall_s)}
        return Sample(sample.steps, wall_s=sample.wall_s, extra=extra)

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

    def many_chains(self, chains: int = MANY_RUNS, links: int = MANY_STEPS) -> Sample:
        """``chains`` chains of ``links`` no-op links, sent one after another at once.

        The canvases are built first (untimed); the clock starts before the first
        ``apply_async`` (how long they take is ``submit_s``). Wall time ends when the
        last chain's result is in (results are collected in sending order, through the
        Redis result backend).

        A chain's latency runs from ``time.time()`` just before its own ``apply_async``
        to the start of its last link: ``links - 1`` ``noop`` then ``stamp``, a no-op
        that returns the worker's ``time.time()`` (the same host's clock). Read from the
        results, it costs nothing while the chains run, unlike polling 500 results
        (which would compete with the worker and round every latency to the poll). It
        leaves out the last link's own execution and the storing of its result (well
        under a millisecond), which the engine's latency, ending at the run's
        ``completed_at``, includes.
        """
        try:
            canvases = [chain(*self._noops(links - 1), stamp.si()) for _ in range(chains)]
            sent: list[float] = []
            results: list[Any] = []
            started = time.perf_counter()
            deadline = started + self.timeout
            for canvas in canvases:
                sent.append(time.time())
                results.append(canvas.apply_async())
            submitted = time.perf_counter() - started
            stamps = [float(self._get(result, deadline)) for result in results]
            wall = time.perf_counter() - started
            latencies = [stamped - at for stamped, at in zip(stamps, sent, strict=True)]
        except CeleryTimeout:
            self._purge()
            return Sample(chains * links, error=f"timed out after {self.timeout:g}s")
        except Exception as exc:  # noqa: BLE001 - a failure is a figure too
            self._purge()
            return Sample(chains * links, error=_describe(exc))
        extra = _many_extra(chains, wall, submitted, latencies)
        return Sample(chains * links, wall_s=wall, extra=extra)

    def _purge(self) -> None:
        """Drop what a failed scenario left queued, so that it does not slow the next."""
        with contextlib.suppress(Exception), app.connection_for_write() as connection:
            channel: Any = connection.default_channel  # kombu's Redis channel
            channel.queue_purge(BENCH_QUEUE)
