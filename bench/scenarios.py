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

The many-runs scenarios (``many_runs``, ``many_runs_orgs``, ``many_runs_api``,
``many_chains``) submit through ``bench.clients``: BENCH_CLIENTS processes side by side,
each its share, as a service's clients do (``Engine.many_runs`` and ``Raw.many_chains``
say what is timed).
"""

from __future__ import annotations

import contextlib
import statistics
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from celery import chain, chord, group
from celery.canvas import Signature
from celery.exceptions import TimeoutError as CeleryTimeout
from django.db.models import Count
from django.utils import timezone

from billing.models import Organization
from billing.services import api_key_create, credits_grant, organization_create
from config.celery import app
from runs import catalogue, services
from runs.engine.start import run_start
from runs.models import Run, Step
from runs.states import RUN_TERMINAL, RunStatus, StepStatus

from .clients import Batch, Clients, Submission, shares
from .plans import (
    FLEET_NOOP,
    SLEEP_S,
    SLEEP_WIDTH,
    WIDE_FAN_WIDTH,
    fan_plan,
    sequential_plan,
    sleep_fan_plan,
    wide_fan_plan,
)
from .procs import CpuMeter
from .raw_tasks import BENCH_QUEUE, join, noop, sleep, stamp

if TYPE_CHECKING:
    from .web import Web

POLL_S = 0.01
# many_runs: one COUNT over 500 ids per poll. Latencies come from completed_at, not from
# the poll, and 50 ms is 0.1% of a wall of ~1 minute: less frequent, less to compete with
# the worker for the CPUs.
MANY_POLL_S = 0.05
LATENCY_SAMPLES = 10
MANY_RUNS = 500  # many_runs / many_chains: this many runs (chains) submitted at once
MANY_STEPS = 5  # of this many sequential no-op steps (links) each
MANY_ORGS = 8  # many_runs_orgs: the runs spread over this many organizations
# noisy_neighbour: B's small run starts this long after A's fan-out; its time alone is
# the median of this many runs.
NOISY_DELAY_S = 1.0
NOISY_EVERY_S = 3.0
NOISY_SMALL_STEPS = 5
NOISY_IDLE_SAMPLES = 5
NOISY_BESIDE_SAMPLES = 5


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


def _cpu(meter: CpuMeter | None, batch: Batch, wall: float) -> dict[str, float]:
    """With a meter, the CPU per run of each part from the clock's start until now (the
    wall's end)."""
    if meter is None or not batch.at_start:
        return {}
    return CpuMeter.per_unit(batch.at_start, meter.read(), len(batch.submissions), wall)


def _many_extra(
    wall: float, batch: Batch, completions: list[float], cpu: dict[str, float]
) -> dict[str, float]:
    """runs/s; the calls' own time (start latency: a call until it returned) and each
    run's (completion latency: its call until it was done), p50 and p95; ``cpu``
    (``_cpu``)."""
    starts = [submission.took for submission in batch.submissions]
    return {
        **cpu,
        "runs_per_s": len(starts) / wall,
        "submit_s": batch.submitted_s,
        "p50_start_s": percentile(starts, 50),
        "p95_start_s": percentile(starts, 95),
        "p50_latency_s": percentile(completions, 50),
        "p95_latency_s": percentile(completions, 95),
    }


def _timed_calls(items: list[Any], call: Callable[[Any], str]) -> list[Submission]:
    """``call`` for each of ``items``, one after another: a client's submissions."""
    done = []
    for item in items:
        sent, began = time.time(), time.perf_counter()
        ref = call(item)
        done.append(Submission(ref, sent, time.perf_counter() - began))
    return done


def _connect() -> None:
    """Open this client's database and broker connections before the clock, as a
    long-lived client has them; otherwise its first call would pay for them."""
    from django.db import connection

    connection.ensure_connection()
    with app.producer_or_acquire() as producer:
        producer.connection.ensure_connection()


# The clients' jobs (bench.clients.Job): run in a client process with its share.
def start_runs(ids: list[str]) -> Callable[[], list[Submission]]:
    """many_runs: ``run_start`` of each created run, in process, as a service that
    embeds the engine would call it."""
    _connect()

    def call(pk: str) -> str:
        run_start(run_id=pk, actor="bench")
        return pk

    return lambda: _timed_calls(ids, call)


def send_chains(count: int, links: int) -> Callable[[], list[Submission]]:
    """many_chains: ``count`` chains of ``links - 1`` no-ops and a ``stamp``, built
    before the clock; ``apply_async`` of each."""
    _connect()
    canvases = [chain(*[noop.si() for _ in range(links - 1)], stamp.si()) for _ in range(count)]
    return lambda: _timed_calls(canvases, lambda canvas: str(canvas.apply_async().id))


def post_runs(url: str, keys: list[str], plan: dict[str, Any]) -> Callable[[], list[Submission]]:
    """many_runs_api: ``POST /api/v1/runs {"plan": plan, "start": true}`` once per key
    in ``keys`` (each run's organization's), through the project's own client library
    (an Idempotency-Key on every POST, as it always sends; no retries: a refusal is a
    failure here). One connection per key, opened before the clock."""
    from orchestrator_client import Client

    sessions = {key: Client(url, key, retries=0) for key in set(keys)}
    for session in sessions.values():
        session.organization()  # connected, and the web worker it reached warmed up

    def submit() -> list[Submission]:
        try:
            return _timed_calls(keys, lambda key: str(sessions[key].submit(plan)["id"]))
        finally:
            for session in sessions.values():
                session.close()

    return submit


# --------------------------------------------------------------------------- figures
def efficiency(width: int, seconds: float, slots: int, wall: float) -> float:
    """The ideal wall of ``width`` sleeps of ``seconds`` on ``slots`` worker slots, over
    the measured one: 1.0 when every slot sleeps all the time."""
    return width * seconds / slots / wall if wall > 0 else 0.0


# --------------------------------------------------------------------------- engine
class Engine:
    """Submits plans on behalf of one organization with credits to spare (the many-runs
    scenarios: of new ones each time).

    ``alive`` says whether the worker still runs: every wait gives up when it does not.
    ``clients`` submit the many-runs scenarios, ``web`` serves ``many_runs_api``.
    """

    def __init__(
        self,
        timeout: float,
        alive: Callable[[], bool],
        slots: int = 1,
        clients: Clients | None = None,
        web: Web | None = None,
        meter: CpuMeter | None = None,
    ) -> None:
        self.timeout = timeout
        self.alive = alive
        self.slots = slots  # the fleet's worker slots (prefork children): for efficiency
        self.clients = clients
        self.web = web
        self.meter = meter  # the many-runs scenarios' CPU by owner, when given
        self._web_warm = False
        self.organization = _organization()

    def _create(self, spec: dict[str, Any], organization: Organization | None = None) -> Run:
        return services.run_create(
            organization=organization or self.organization, plan=spec, actor="bench"
        )

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

    def fan_fleet_tool(self, width: int) -> Sample:
        """``fan_plan(width)`` of the fleet's decorated no-op (bench/fleet_tools.py), once
        the worker has published it: its plan is checked against the catalogue."""
        started = time.perf_counter()
        while catalogue.current_version(self.organization.pk, FLEET_NOOP) is None:
            if time.perf_counter() - started > self.timeout or not self.alive():
                return Sample(width + 1, error=f"the worker did not publish {FLEET_NOOP}")
            time.sleep(POLL_S)
        return self.run(fan_plan(width, FLEET_NOOP), width + 1)

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

    def many_runs(
        self, runs: int = MANY_RUNS, steps: int = MANY_STEPS, organizations: int = 1
    ) -> Sample:
        """``runs`` runs of ``steps`` sequential no-op steps, started by the clients at
        once, in ``organizations`` new organizations (run i in organization i modulo
        their number: with as many organizations as clients, one each).

        All runs are created first (``run_create``, untimed); each client then calls
        ``run_start`` for its share, one after another. The clock starts when every
        client is ready; the calls' own time is the start latency, ``submit_s`` when the
        last returned. Wall time ends when one COUNT of the runs not yet terminal,
        polled every 50 ms once the clients are done, reads 0. A run's completion
        latency runs from its client's ``time.time()`` just before its ``run_start`` to
        its ``completed_at`` (the worker's clock, the same host's).
        """
        try:
            clients = self._clients()
            orgs = [_organization() for _ in range(organizations)]
            ids = [
                str(self._create(sequential_plan(steps), orgs[i % organizations]).pk)
                for i in range(runs)
            ]
            jobs = [(share,) for share in shares(ids, clients.count)]
            return self._many(clients.submit(start_runs, jobs, self.timeout, self._reading), steps)
        except Exception as exc:  # noqa: BLE001 - a failure is a figure too
            return Sample(runs * steps, error=_describe(exc))

    def many_runs_api(
        self, runs: int = MANY_RUNS, steps: int = MANY_STEPS, organizations: int = 1
    ) -> Sample:
        """``many_runs`` through the API: each client creates and starts its share with
        ``POST /api/v1/runs {"start": true}`` (an API key per organization) against the
        bench's gunicorn (``bench.web``). The call's time includes creating the run,
        which ``many_runs`` leaves out of the clock; the rest is timed alike."""
        try:
            clients, url = self._clients(), self._web_url()
            keys = [_api_key(_organization()) for _ in range(organizations)]
            per_run = [keys[i % organizations] for i in range(runs)]
            plan = sequential_plan(steps)
            jobs = [(url, share, plan) for share in shares(per_run, clients.count)]
            batch = clients.submit(post_runs, jobs, self.timeout, self._reading)
            return self._many(batch, steps)
        except Exception as exc:  # noqa: BLE001 - a failure is a figure too
            return Sample(runs * steps, error=_describe(exc))

    def _clients(self) -> Clients:
        if self.clients is None:
            raise ScenarioFailed("no clients to submit with (Engine(clients=...))")
        return self.clients

    def _web_url(self) -> str:
        """The web tier's URL, once it has served a run from every client untimed (each
        web worker imports the API's modules on its first requests, a cost no client of
        a settled deployment sees)."""
        if self.web is None:
            raise ScenarioFailed("no web server to submit to (Engine(web=...))")
        url = self.web.url()
        if not self._web_warm:
            clients = self._clients()
            keys = [_api_key(_organization())] * (2 * clients.count)
            plan = sequential_plan(1)
            jobs = [(url, share, plan) for share in shares(keys, clients.count)]
            self._many(clients.submit(post_runs, jobs, self.timeout), 1)
            self._web_warm = True
        return url

    def _many(self, batch: Batch, steps: int) -> Sample:
        """Wait until every run of ``batch`` is terminal, check that each completed its
        ``steps``: the figures of ``many_runs``."""
        ids = [submission.ref for submission in batch.submissions]
        self._wait_all_terminal(ids, batch.started_perf)
        wall = time.perf_counter() - batch.started_perf
        cpu = _cpu(self.meter, batch, wall)
        finished = self._check_all_completed(ids, steps)
        completions = [finished[s.ref].timestamp() - s.sent for s in batch.submissions]
        extra = _many_extra(wall, batch, completions, cpu)
        return Sample(len(ids) * steps, wall_s=wall, extra=extra)

    def _reading(self) -> dict[str, float]:
        return self.meter.read() if self.meter is not None else {}

    def _wait_all_terminal(self, ids: list[str], started: float) -> None:
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

    def _check_all_completed(self, ids: list[str], steps: int) -> dict[str, datetime]:
        """Every run COMPLETED with ``steps`` completed steps: their ``completed_at``."""
        rows = Run.objects.filter(pk__in=ids).values_list("pk", "status", "completed_at")
        finished = {str(pk): at for pk, status, at in rows if status == RunStatus.COMPLETED and at}
        if len(finished) != len(ids):
            failed = next(pk for pk in ids if pk not in finished)
            run = Run.objects.filter(pk=failed).values_list("status", "last_error").get()
            detail = f": {run[1]}" if run[1] else ""
            raise ScenarioFailed(
                f"{len(ids) - len(finished)} of {len(ids)} runs did not complete "
                f"(run {failed} ended {run[0]}{detail})"
            )
        done = {
            str(pk): count
            for pk, count in Step.objects.filter(run_id__in=ids, status=StepStatus.COMPLETED)
            .values("run_id")
            .annotate(done=Count("pk"))
            .values_list("run_id", "done")
        }
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


def _organization() -> Organization:
    """A new organization with credits to spare."""
    organization = organization_create(name=f"bench-{uuid.uuid4().hex[:8]}")
    credits_grant(organization=organization, amount=10_000_000, reason="benchmark")
    return organization


def _api_key(organization: Organization) -> str:
    return api_key_create(organization=organization, name="bench")[1]


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

    def __init__(
        self,
        timeout: float,
        alive: Callable[[], bool],
        slots: int = 1,
        clients: Clients | None = None,
        meter: CpuMeter | None = None,
    ) -> None:
        self.timeout = timeout
        self.alive = alive
        self.slots = slots
        self.clients = clients
        self.meter = meter

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
        """``chains`` chains of ``links`` no-op links, sent by the clients at once, each
        its share (``many_runs``'s raw twin; organizations mean nothing to raw Celery, so
        it is the twin of ``many_runs_orgs`` too).

        Each client builds its canvases first (untimed); the clock starts when every
        client is ready, and each calls ``apply_async`` for its chains one after
        another (their time is the start latency). Wall time ends when the last
        chain's result is in (results are collected once the clients are done, in
        sending order, through the Redis result backend).

        A chain's completion latency runs from its client's ``time.time()`` just before
        its ``apply_async`` to the start of its last link: ``links - 1`` ``noop`` then
        ``stamp``, a no-op that returns the worker's ``time.time()`` (the same host's
        clock). Read from the results, it costs nothing while the chains run, unlike
        polling 500 results (which would compete with the worker and round every
        latency to the poll). It leaves out the last link's own execution and the
        storing of its result (well under a millisecond), which the engine's latency,
        ending at the run's ``completed_at``, includes.
        """
        try:
            if self.clients is None:
                raise ScenarioFailed("no clients to submit with (Raw(clients=...))")
            counts = [len(share) for share in shares(range(chains), self.clients.count)]
            jobs = [(count, links) for count in counts]
            meter = self.meter
            batch = self.clients.submit(
                send_chains, jobs, self.timeout, meter.read if meter is not None else None
            )
            deadline = batch.started_perf + self.timeout
            stamps = [float(self._get(app.AsyncResult(s.ref), deadline)) for s in batch.submissions]
            wall = time.perf_counter() - batch.started_perf
            cpu = _cpu(meter, batch, wall)
            completions = [
                stamped - s.sent for stamped, s in zip(stamps, batch.submissions, strict=True)
            ]
        except CeleryTimeout:
            self._purge()
            return Sample(chains * links, error=f"timed out after {self.timeout:g}s")
        except Exception as exc:  # noqa: BLE001 - a failure is a figure too
            self._purge()
            return Sample(chains * links, error=_describe(exc))
        extra = _many_extra(wall, batch, completions, cpu)
        return Sample(chains * links, wall_s=wall, extra=extra)

    def _purge(self) -> None:
        """Drop what a failed scenario left queued, so that it does not slow the next."""
        with contextlib.suppress(Exception), app.connection_for_write() as connection:
            channel: Any = connection.default_channel  # kombu's Redis channel
            channel.queue_purge(BENCH_QUEUE)
