"""Tools an `orch worker` serves in tests/integration/test_worker_tools.py (the worker
imports this module by name, from the checkout)."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

from orchestrator_client.tools import Context, tool


@tool(name="testing.count", version="1")
def count(ctx: Context, to: int, pause: float = 0.0, marker: str = "") -> dict[str, object]:
    """Count to ``to``, saying how far it got; stops when the step is cancelled.

    Args:
        to: where to stop.
        pause: seconds to spend on each number.
        marker: a file written once the count has begun and said its progress.
    """
    for number in range(1, to + 1):
        ctx.heartbeat({"counted": number, "of": to})
        if marker and number == 1:
            Path(marker).write_text("counting")
        ctx.sleep(pause)
    return {"counted": to, "host": socket.gethostname(), "pid": os.getpid()}


@tool(name="testing.stubborn", version="1")
def stubborn(marker: str) -> str:
    """Ignore every stop: only the worker's grace period ends it.

    Args:
        marker: a file written once it has begun.
    """
    Path(marker).write_text("started")
    while True:
        time.sleep(0.05)


@tool(name="testing.when_released", version="1")
def when_released(ctx: Context, release: str) -> dict[str, object]:
    """Wait for the file ``release`` to exist, then answer which worker ran it.

    Args:
        release: the file whose existence ends the wait.
    """
    while not Path(release).exists():
        ctx.sleep(0.05)
    return {"pid": os.getpid()}
