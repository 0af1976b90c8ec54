"""Raw Celery baselines: the engine's no-op work with Celery canvas and nothing else.

Registered with the project's app and routed to their own queue, ``bench``, which the
benchmark's worker consumes next to the engine queues. Results are kept (the project
ignores results by default): chains, groups and chords need them.
"""

from __future__ import annotations

import time
from typing import Any

from config.celery import app

BENCH_QUEUE = "bench"


@app.task(name="bench.noop", ignore_result=False, queue=BENCH_QUEUE)
def noop(*args: Any) -> None:
    """Do nothing: the raw counterpart of the engine's ``noop`` tool."""
    return None


@app.task(name="bench.sleep", ignore_result=False, queue=BENCH_QUEUE)
def sleep(seconds: float) -> None:
    """Sleep ``seconds``: the raw counterpart of the engine's ``sleep`` tool (a step that
    takes time without using a CPU)."""
    time.sleep(seconds)


@app.task(name="bench.join", ignore_result=False, queue=BENCH_QUEUE)
def join(results: list[Any]) -> int:
    """A chord body: receives every header result."""
    return len(results)


@app.task(name="bench.stamp", ignore_result=False, queue=BENCH_QUEUE)
def stamp() -> float:
    """Return when the task started (epoch seconds): raw start latency."""
    return time.time()
