"""The benchmark's clients: BENCH_CLIENTS processes that submit as a service's clients do.

A service is not driven by one loop: its clients submit side by side. ``Clients`` holds
that many processes; a scenario hands each its share of the submissions, every client
prepares its share untimed (builds its canvases, opens its HTTP connections), then all
of them and the benchmark wait at one barrier, and the benchmark's clock starts when it
opens. Each client then makes its calls one after another, as fast as they return,
and hands back a ``Submission`` for each: what the call returned, when it was made,
how long it took.

Processes, not threads, and the same processes for the engine's scenarios and raw
Celery's: a submission is mostly Python in the submitting process (``run_start`` does
its Django ORM work there, ``apply_async`` serialises and publishes, an HTTP client
encodes and decodes), so threads of one process would take turns on its GIL, and on a
machine with cores to spare the driver, not the system measured, would set the figure.

The processes are spawned (fresh interpreters, as separate client programs are: no
copy of the benchmark's connections) on the first scenario that needs them, each sets
Django up once, and they serve every scenario after until ``close()``. A call that
fails in a client fails the scenario; a client that dies or hangs too, and then every
process is replaced on the next scenario.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from multiprocessing.context import SpawnProcess
from typing import Any

# How long a client may take to start (spawn, Django set up) and prepare its share.
READY_TIMEOUT_S = 120.0
# A client whose benchmark process is gone stops within this many seconds.
ORPHAN_CHECK_S = 5.0


@dataclass(frozen=True)
class Submission:
    """One call of one client.

    ``ref``: what identifies what it submitted (a run's id, a Celery result's id).
    ``sent``: ``time.time()`` just before the call: every process's clock on this host,
    and PostgreSQL's, so it can be set against a run's ``completed_at`` or a task's own
    ``time.time()``. ``took``: seconds until the call returned (``perf_counter``).
    """

    ref: str
    sent: float
    took: float


# A job: called in a client with its share's arguments, it prepares (untimed) and
# returns the submitting itself, run once the barrier opens. A module-level function,
# so that it reaches the spawned process by name.
Job = Callable[..., Callable[[], list[Submission]]]


@dataclass(frozen=True)
class Batch:
    """Every client's submissions for one scenario, in client order."""

    started: float  # time.time() when the barrier opened
    started_perf: float  # the same moment, perf_counter (for wall times)
    submissions: list[Submission]
    # What ``submit``'s ``at_start`` returned at that moment (a CpuMeter's reading).
    at_start: dict[str, float] | None = None

    @property
    def submitted_s(self) -> float:
        """From the barrier until the last call returned."""
        ends = [s.sent + s.took for s in self.submissions]
        return max(ends) - self.started if ends else 0.0


class ClientsFailed(Exception):
    """A client could not prepare or submit its share, died or did not answer."""


def shares(items: Sequence[Any], count: int) -> list[list[Any]]:
    """``items`` dealt to ``count`` clients in turn: client i gets items i, i + count, ..."""
    return [list(items[index::count]) for index in range(count)]


class Clients:
    """``count`` client processes; ``env``: set in each before Django is (a test's
    database, its settings module)."""

    def __init__(self, count: int, env: Mapping[str, str] | None = None) -> None:
        if count < 1:
            raise ValueError("at least one client")
        self.count = count
        self.env = dict(env or {})
        self._context = multiprocessing.get_context("spawn")
        self._processes: list[SpawnProcess] = []
        self._inboxes: list[Any] = []
        self._outbox: Any = None
        self._barrier: Any = None

    def __enter__(self) -> Clients:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _start(self) -> None:
        ctx = self._context
        self._barrier = ctx.Barrier(self.count + 1)
        self._outbox = ctx.Queue()
        self._inboxes = [ctx.Queue() for _ in range(self.count)]
        self._processes = [
            ctx.Process(
                target=_serve,
                args=(index, self.env, os.getpid(), inbox, self._outbox, self._barrier),
                name=f"bench-client-{index}",
                daemon=True,
            )
            for index, inbox in enumerate(self._inboxes)
        ]
        for process in self._processes:
            process.start()

    def submit(
        self,
        job: Job,
        args: Sequence[tuple[Any, ...]],
        timeout: float,
        at_start: Callable[[], dict[str, float]] | None = None,
    ) -> Batch:
        """Client i runs ``job(*args[i])`` (a client beyond ``args`` sits this one out);
        the clock starts when all have prepared, and ``at_start`` is read then.
        ``timeout``: seconds for the submitting, once started."""
        if len(args) > self.count:
            raise ValueError(f"{len(args)} shares for {self.count} clients")
        if not self._processes:
            self._start()
        try:
            for index, inbox in enumerate(self._inboxes):
                inbox.put((job, args[index]) if index < len(args) else (_idle, ()))
            try:
                self._barrier.wait(READY_TIMEOUT_S)
            except threading.BrokenBarrierError:
                raise ClientsFailed(self._why("did not get ready")) from None
            started_perf, started = time.perf_counter(), time.time()
            reading = at_start() if at_start is not None else None
            replies: dict[int, tuple[list[Submission], str | None]] = {}
            deadline = started_perf + timeout
            while len(replies) < self.count:
                try:
                    index, submissions, error = self._outbox.get(
                        timeout=max(0.1, min(2.0, deadline - time.perf_counter()))
                    )
                except queue.Empty:
                    if time.perf_counter() > deadline:
                        raise ClientsFailed(f"timed out after {timeout:g}s") from None
                    if not all(process.is_alive() for process in self._processes):
                        raise ClientsFailed(self._why("died")) from None
                    continue
                replies[index] = (submissions, error)
        except BaseException:
            self.close()  # whatever state they are in, the next scenario gets new ones
            raise
        errors = [f"client {i}: {error}" for i, (_, error) in sorted(replies.items()) if error]
        if errors:
            more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
            raise ClientsFailed(errors[0] + more)
        submissions = [s for _, (done, _) in sorted(replies.items()) for s in done]
        return Batch(started, started_perf, submissions, reading)

    def pids(self) -> list[int]:
        """The client processes' (none before the first ``submit``)."""
        return [process.pid for process in self._processes if process.pid is not None]

    def _why(self, what: str) -> str:
        dead = [p.name for p in self._processes if not p.is_alive()]
        return f"a client {what}" + (f" ({', '.join(dead)} exited)" if dead else "")

    def close(self) -> None:
        """Stop the processes (asked first, then terminated)."""
        for inbox in self._inboxes:
            with contextlib.suppress(Exception):
                inbox.put(None)
        for process in self._processes:
            process.join(5)
            if process.is_alive():
                process.terminate()
                process.join(5)
        self._processes, self._inboxes = [], []


def _idle() -> Callable[[], list[Submission]]:
    return list


def _serve(
    index: int, env: dict[str, str], parent: int, inbox: Any, outbox: Any, barrier: Any
) -> None:
    """One client process: set Django up, then serve jobs until told to stop (None) or
    the benchmark's process is gone."""
    os.environ.update(env)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.local")
    import django

    django.setup()
    while True:
        try:
            message = inbox.get(timeout=ORPHAN_CHECK_S)
        except queue.Empty:
            if os.getppid() != parent:
                return
            continue
        if message is None:
            return
        job, args = message
        submit: Callable[[], list[Submission]] | None = None
        submissions: list[Submission] = []
        error: str | None = None
        try:
            submit = job(*args)
        except Exception as exc:  # noqa: BLE001 - reported to the benchmark, a figure too
            error = f"preparing: {type(exc).__name__}: {exc}"
        try:
            # Broken by the benchmark's own wait when another client hangs; a timeout
            # of its own for when the benchmark is gone.
            barrier.wait(READY_TIMEOUT_S * 2)
        except threading.BrokenBarrierError:
            return
        if submit is not None:
            try:
                submissions = submit()
            except Exception as exc:  # noqa: BLE001 - reported to the benchmark
                error = f"{type(exc).__name__}: {str(exc)[:300]}"
        outbox.put((index, submissions, error))
