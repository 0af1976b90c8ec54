"""What a running tool sees of its step: ``Context``.

A tool that declares a first parameter annotated ``Context`` gets one. Wherever the tool
runs (in the Celery fleet, on an ``orch worker``, in the test harness), the context has
the same methods; what stands behind them differs:

- ``heartbeat(progress)`` says the tool is alive and how far it got (any JSON value); on
  a worker the progress reaches the server with the job's next report of it, readable at
  ``GET /runner-jobs/{id}`` while the job runs. Once a stop was asked for (the run was
  cancelled, the step timed out, the job was stopped) it raises ``Cancelled``.
- ``cancelled`` says whether a stop was asked for, without raising; ``sleep(seconds)``
  sleeps in slices and raises ``Cancelled`` as soon as one is; ``stop_event`` is set then
  (a ``threading.Event`` to wait on).
- ``upload(name, data)`` saves bytes, a file path or a binary stream as an artifact of
  the run, made by this step (docs/artifacts.md), and returns its description; the
  step's output lists the ids of those saved (``with_artifacts``), in the fleet and on
  a worker alike.
- ``run_id``, ``step_id``, ``step_path`` (``agent.task.step``) and ``attempt`` say which
  attempt of which step this is: an idempotency key for a service the tool calls can be
  made of them, so that a retried attempt is recognised there.

An ``async`` tool on a worker is also cancelled the asyncio way once a stop comes: the
coroutine gets ``asyncio.CancelledError`` at its next ``await``.
"""

from __future__ import annotations

import io
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

from orchestrator_client.tools.failures import Cancelled, ToolFailure

# How often ``cancelled`` asks its source (a database query on the fleet) at most.
CHECK_INTERVAL = 0.25

Uploader = Callable[[str, BinaryIO, int, str], dict[str, Any]]


def _no_upload(name: str, stream: BinaryIO, size: int, content_type: str) -> dict[str, Any]:
    raise ToolFailure("tool_error", "this step cannot save artifacts", retryable=False)


class Context:
    """One attempt of one step, as its tool sees it (the module's doc)."""

    def __init__(
        self,
        *,
        run_id: str = "",
        step_id: int = 0,
        attempt: int = 1,
        step_path: str | Callable[[], str] = "",
        job_id: str = "",
        timeout_s: float | None = None,
        progress: Callable[[Any], None] | None = None,
        stop_requested: Callable[[], bool] | None = None,
        upload: Uploader = _no_upload,
    ) -> None:
        self.run_id = run_id
        self.step_id = step_id
        self.attempt = attempt
        self.job_id = job_id
        self.timeout_s = timeout_s
        self.stop_event = threading.Event()
        self._path = step_path
        self._progress = progress
        self._stop_requested = stop_requested
        self._upload = upload
        self._checked_at = 0.0
        self.last_progress: Any = None

    @property
    def step_path(self) -> str:
        """``agent.task.step``: where the step stands in its run's plan."""
        if callable(self._path):
            self._path = self._path()
        return self._path

    @property
    def cancelled(self) -> bool:
        """Whether a stop was asked for (looked up at most every ``CHECK_INTERVAL``)."""
        if self.stop_event.is_set():
            return True
        now = time.monotonic()
        if self._stop_requested is not None and now - self._checked_at >= CHECK_INTERVAL:
            self._checked_at = now
            if self._stop_requested():
                self.stop_event.set()
        return self.stop_event.is_set()

    def cancel(self) -> None:
        """Ask the tool to stop (what a worker does when the server says so)."""
        self.stop_event.set()

    def heartbeat(self, progress: Any = None) -> None:
        """The tool is alive, ``progress`` how far it got; ``Cancelled`` once a stop
        was asked for."""
        if progress is not None:
            self.last_progress = progress
            if self._progress is not None:
                self._progress(progress)
        if self.cancelled:
            raise Cancelled("the step was cancelled while running")

    def sleep(self, seconds: float) -> None:
        """Sleep, in slices; ``Cancelled`` as soon as a stop is asked for."""
        deadline = time.monotonic() + seconds
        while True:
            if self.cancelled:
                raise Cancelled("the step was cancelled while running")
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self.stop_event.wait(min(left, CHECK_INTERVAL))

    def upload(
        self, name: str, data: bytes | str | Path | BinaryIO, content_type: str = ""
    ) -> dict[str, Any]:
        """Save ``data`` (bytes, a file's path, or a binary stream read to its end) as
        the artifact ``name``; its ``{id, name, size, sha256, content_type}``."""
        if isinstance(data, bytes):
            return self._upload(name, io.BytesIO(data), len(data), content_type)
        if isinstance(data, str | Path):
            with open(data, "rb") as stream:
                return self._upload(name, stream, os.fstat(stream.fileno()).st_size, content_type)
        content = data.read()
        return self._upload(name, io.BytesIO(content), len(content), content_type)


def with_artifacts(output: Any, saved: list[str]) -> Any:
    """A step's output naming the artifacts its tool saved, by id, under ``artifacts``
    (an output that is not an object kept under ``result``); as it was when none."""
    if not saved:
        return output
    if isinstance(output, dict):
        return {**output, "artifacts": list(saved)}
    return {"result": output, "artifacts": list(saved)}
