"""``Worker``: serve ``@tool`` functions from your own hosts (docs/tools.md, "On your hosts").

    Worker([summarize], url="https://orch.example", api_key="ork_...", concurrency=8).run()

or ``orch worker acme_tools.worker``. A worker is a runner of the runner protocol
(docs/runners.md), connecting out over HTTP(S) only, so it works behind NAT:

- **Registers** with its tools' definitions (``Tool.definition``: the server keeps them in
  the organization's catalogue and checks plans against them) and its ``tags``, which
  steps may demand (``params.demands``). It claims the jobs of those tools, at those
  versions, and nothing else.
- **Long-polls**, asking for up to its free slots at once (``max_jobs``); with every
  slot busy it asks for stop commands only. Each job runs in a thread of its own (an
  ``async`` tool in the worker's one event loop), at most ``concurrency`` at once.
- **Heartbeats** every second that a tool said something new (``Context.heartbeat``),
  else every ``heartbeat_interval`` the server gave, with each job's last progress.
- **Stops**: a stop command (the run was cancelled, the step timed out, the job was
  stopped) sets the job's ``Context`` cancelled (``heartbeat`` and ``sleep`` raise
  ``Cancelled``; an ``async`` tool gets ``asyncio.CancelledError``). A tool that ends
  within ``grace_period`` is reported ``stopped`` with ``SIGTERM``; one that does not is
  ended (an exception raised in its thread at its next Python instruction), reported
  ``stopped`` with ``SIGKILL``, and its slot given back whatever it does next.
- **Uploads** what a tool saves (``Context.upload``) as an artifact of its job's step
  (``POST /runner/jobs/{id}/artifacts``), its output listing them as on the fleet.
- **Reports** the outcome as the tool classified it (``completed`` with the output,
  ``failed`` with the engine's error code and whether it may be retried); a job still
  running ``STARTED_AFTER`` (0.2 s) after its claim is reported ``started`` first. The
  reports go several at once (``POST /runner/reports``, one request and one transaction
  on the server): one thread sends what has been queued, at once when no job it holds is
  still running, else once the first has waited ``BATCH_WINDOW`` (5 ms) for others; each
  batch retried under one ``Idempotency-Key`` until the server answers, so it is applied
  once. A job's slot is given back once its last report is answered.
- **Shuts down** on ``stop()`` (``orch worker``: SIGINT or SIGTERM): it claims nothing
  more, lets running jobs finish for ``grace_period``, then deregisters; jobs still
  running then are recovered by the server (``runner_lost``) and retried elsewhere.
"""

from __future__ import annotations

import asyncio
import ctypes
import importlib
import logging
import os
import signal
import socket
import sys
import threading
import time
import uuid
from collections.abc import Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field
from types import FrameType, ModuleType
from typing import IO, Any

from orchestrator_client.client import Client
from orchestrator_client.errors import ApiError, OrchestratorError
from orchestrator_client.tools import Context, Outcome, Tool
from orchestrator_client.tools.context import with_artifacts
from orchestrator_client.tools.failures import Cancelled, ToolFailure

logger = logging.getLogger("orchestrator_client.worker")

EXECUTOR_TYPE = "orch-worker"
# How often the heartbeat thread looks for new progress to send.
PROGRESS_INTERVAL = 1.0
# How long a report is retried while the server cannot be reached, at most.
REPORT_PATIENCE = 300.0
# A job still running this long after its claim is reported started; one done sooner is
# reported once, by its end (a completed report is accepted from a claimed job): half
# the requests of a short job.
STARTED_AFTER = 0.2
# How long a report waits for others to go in its request while a job the worker holds
# is still running (none running: it goes at once). A slot waits on its report, so
# this is added to a job's time only when jobs end a few milliseconds apart.
BATCH_WINDOW = 0.005
# The most reports in one request (the server's limit).
MAX_BATCH = 100


class Ended(Cancelled):
    """Raised in a tool's thread that ignored its stop for the grace period."""


class Interrupted(Exception):
    """SIGINT or SIGTERM came while the worker waited on its poll (``serve``)."""


@dataclass
class Queued:
    """A report waiting for its request: ``job`` given back once it is answered (the
    job's last report)."""

    job_id: str
    kind: str
    body: dict[str, Any]
    job: Job | None = None
    at: float = field(default_factory=time.monotonic)


def tools_in(target: Any) -> list[Tool[Any]]:
    """The tools ``target`` names: a tool, a list of them, a module (every ``Tool`` in
    it), or a dotted name of a module (``pkg.mod``) or of one of its attributes
    (``pkg.mod:attr``)."""
    if isinstance(target, str):
        module_name, _, attribute = target.partition(":")
        module = importlib.import_module(module_name)
        return tools_in(getattr(module, attribute) if attribute else module)
    if isinstance(target, Tool):
        return [target]
    if isinstance(target, ModuleType):
        return [item for item in vars(target).values() if isinstance(item, Tool)]
    found: list[Tool[Any]] = []
    for item in target:
        found += tools_in(item)
    return found


@dataclass
class Job:
    """One job the worker holds."""

    id: str
    tool: Tool[Any]
    params: dict[str, Any]
    context: Context
    thread: threading.Thread | None = None
    future: Future[Outcome] | None = None
    # Set once its report is made (or the job was given up): nothing more is sent.
    done: threading.Event = field(default_factory=threading.Event)
    progress_sent: Any = None
    # Its reports queued one at a time: a `started` queued late never follows its end's.
    reporting: threading.Lock = field(default_factory=threading.Lock)
    ended: bool = False
    started: threading.Timer | None = None
    # The ids of the artifacts its tool saved, listed in its output.
    saved: list[str] = field(default_factory=list)


class Worker:
    """Serves ``tools`` for one organization (the module's doc). ``tools``: what
    ``tools_in`` reads (tools, modules, dotted names)."""

    def __init__(
        self,
        tools: Any,
        *,
        url: str | None = None,
        api_key: str | None = None,
        client: Client | None = None,
        concurrency: int = 8,
        tags: Iterable[str] = (),
        hostname: str | None = None,
        project_dir: str | None = None,
        grace_period: float = 5.0,
        poll_wait: int = 30,
    ) -> None:
        self.tools = {found.name: found for found in tools_in(tools)}
        if not self.tools:
            raise ValueError(f"no @tool functions found in {tools!r}")
        if client is None:
            # A held poll answers within ``poll_wait``: the read waits longer than that.
            timeout = poll_wait + 15.0
            client = (
                Client(url, api_key, timeout=timeout)
                if url and api_key
                else Client.from_config(timeout=timeout)
            )
        self.client = client
        self.concurrency = max(1, concurrency)
        self.tags = sorted(set(tags))
        self.hostname = hostname or socket.gethostname()
        self.project_dir = project_dir or os.getcwd()
        self.grace_period = grace_period
        self.poll_wait = poll_wait
        self.runner_id = ""
        self.heartbeat_interval = 60.0
        self.jobs: dict[str, Job] = {}
        self._lock = threading.Lock()
        self._slot_freed = threading.Event()
        self._stopping = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        # Reports waiting for their request (``_send_reports``), oldest first.
        self._queue: list[Queued] = []
        self._queued = threading.Condition()
        self._reporter: threading.Thread | None = None
        # True while the main thread waits on a held poll: a signal may interrupt it.
        self.polling = False

    # ------------------------------------------------------------------ lifecycle
    def register(self) -> str:
        """Register (again, with backoff, while an earlier process of this identity is
        still online); the runner's id."""
        body = {
            "hostname": self.hostname,
            "project_dir": self.project_dir,
            "executor_type": EXECUTOR_TYPE,
            "tags": self.tags,
            "tools": [found.definition() for found in self.tools.values()],
        }
        delay = 1.0
        while True:
            try:
                answer = self._post("runner/register", body)
                break
            except ApiError as exc:
                if exc.code != "duplicate_runner" or self._stopping.is_set():
                    raise
                logger.warning("an earlier worker of this identity is online; again in %ss", delay)
                self._stopping.wait(delay)
                delay = min(delay * 2, 30.0)
        self.runner_id = str(answer["runner_id"])
        self.heartbeat_interval = float(answer.get("heartbeat_interval_seconds") or 60)
        logger.info(
            "worker %s offers %s (concurrency %d)",
            self.runner_id,
            ", ".join(f"{t.name} {t.version}" for t in self.tools.values()),
            self.concurrency,
        )
        return self.runner_id

    def run(self) -> None:
        """Register, then serve jobs until ``stop()``; deregister on the way out."""
        self.register()
        beating = threading.Thread(target=self._heartbeats, name="heartbeats", daemon=True)
        beating.start()
        try:
            while not self._stopping.is_set():
                try:
                    self.poll_once()
                except Interrupted:
                    break
                except OrchestratorError as exc:
                    logger.warning("poll failed: %s; again in 1 s", exc)
                    self._stopping.wait(1.0)
        finally:
            self._shut_down()

    def stop(self) -> None:
        """Claim nothing more; ``run`` lets running jobs finish for the grace period,
        deregisters and returns."""
        self._stopping.set()
        self._slot_freed.set()

    def _shut_down(self) -> None:
        deadline = time.monotonic() + self.grace_period
        for job in self._held():
            job.done.wait(max(0.0, deadline - time.monotonic()))
        for job in self._held():
            if job.started is not None:
                job.started.cancel()
            job.context.cancel()  # what it returns now is not reported: it is recovered
            job.done.set()
        try:
            self._post("runner/deregister", {"runner_id": self.runner_id})
        except OrchestratorError as exc:
            logger.warning("could not deregister: %s", exc)
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)

    def _held(self) -> list[Job]:
        with self._lock:
            return list(self.jobs.values())

    def _free(self) -> int:
        with self._lock:
            return self.concurrency - len(self.jobs)

    # ------------------------------------------------------------------ polls
    def poll_once(self) -> None:
        """One poll: up to the free slots' jobs started, stops handed to their jobs."""
        free = self._free()
        if free <= 0:
            # Every slot busy: wait for one to free (or a second), then fetch stops only.
            self._slot_freed.wait(PROGRESS_INTERVAL)
            self._slot_freed.clear()
            free = self._free()
        wait = self.poll_wait if free > 0 else 0
        self.polling = True
        try:
            response = self.client.request(
                "GET",
                "runner/jobs",
                params={"runner_id": self.runner_id, "wait": wait, "max_jobs": max(free, 0)},
            )
        finally:
            self.polling = False
        if response.status_code == 204:
            return
        answer = response.json()
        if answer.get("deregistered"):
            if not self._stopping.is_set():
                logger.warning("the server deregistered this worker; registering again")
                self.register()
            return
        for job_id in answer.get("stop_jobs", []):
            self.cancel(str(job_id))
        # Every job held before any starts: a report then waits for the others of its
        # poll (``_send_reports``), which end as fast, to go in one request.
        held = [self._hold(payload) for payload in answer.get("jobs", [])]
        for job in held:
            if job is not None:
                self._launch(job)

    # ------------------------------------------------------------------ jobs
    def start(self, payload: dict[str, Any]) -> None:
        """Run a job the poll handed over."""
        job = self._hold(payload)
        if job is not None:
            self._launch(job)

    def _hold(self, payload: dict[str, Any]) -> Job | None:
        """The job, now counted among the worker's (None: a tool it does not offer,
        failed)."""
        job_id = str(payload["id"])
        found = self.tools.get(str(payload.get("tool") or ""))
        if found is None:  # the server hands out only what we offer
            self._enqueue(Queued(job_id, "failed", {"error": f"no tool {payload!r} here"}))
            return None
        saved: list[str] = []
        context = Context(
            run_id=str(payload["run"]),
            step_id=int(payload["step"]),
            attempt=int(payload["attempt"]),
            step_path=str(payload.get("step_path") or ""),
            job_id=job_id,
            upload=self._uploader(job_id, saved),
        )
        job = Job(job_id, found, dict(payload.get("params") or {}), context, saved=saved)
        with self._lock:
            self.jobs[job_id] = job
        return job

    def _launch(self, job: Job) -> None:
        job.started = threading.Timer(STARTED_AFTER, self._report_started, args=(job,))
        job.started.daemon = True
        job.started.start()
        if job.tool.is_async:
            job.future = asyncio.run_coroutine_threadsafe(self._run_async(job), self._event_loop())
        else:
            job.thread = threading.Thread(target=self._run, args=(job,), name=f"job-{job.id}")
            job.thread.daemon = True
            job.thread.start()

    def _report_started(self, job: Job) -> None:
        with job.reporting:
            if not job.ended:
                self._enqueue(Queued(job.id, "started", {}))

    def _report_end(self, job: Job, kind: str, body: dict[str, Any]) -> None:
        """Queue the job's last report, once (after its `started`, if that was queued:
        one still waiting is dropped, the server taking an end from a claimed job); the
        job is given back once it is answered."""
        if job.started is not None:
            job.started.cancel()
        with job.reporting:
            if job.ended:
                return
            # Ended and queued under the queue's lock, which the reports thread holds
            # while it asks whether a job is still running: it never sees this job
            # ended before its report is queued (and sends the poll's in two requests).
            with self._queued:
                job.ended = True
                self._queue = [q for q in self._queue if q.job_id != job.id]
                self._enqueue(Queued(job.id, kind, body, job))

    def _run(self, job: Job) -> None:
        try:
            outcome = job.tool.run(job.params, job.context)
        except Ended:
            return  # ended after its grace period: reported by ``cancel``
        except Exception as exc:  # an error of ours: the step fails, retried
            logger.exception("job %s", job.id)
            outcome = Outcome(failure=ToolFailure("runner_failed", str(exc)))
        self._finish(job, outcome)

    async def _run_async(self, job: Job) -> Outcome:
        outcome = await job.tool.arun(job.params, job.context)
        await asyncio.to_thread(self._finish, job, outcome)
        return outcome

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        """The worker's one event loop, in a thread of its own, for ``async`` tools."""
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="tools-loop", daemon=True).start()
                self._loop = loop
            return self._loop

    def _finish(self, job: Job, outcome: Outcome) -> None:
        if job.done.is_set():
            return  # given up (ended, or the worker shut down): the server recovers it
        if job.context.stop_event.is_set():
            self._report_end(job, "stopped", {"signal": "SIGTERM"})
        elif outcome.failure is None:
            output = with_artifacts(outcome.output, job.saved)
            self._report_end(job, "completed", {"result": output})
        else:
            failure = outcome.failure
            body = {"error": failure.message, "code": failure.code}
            self._report_end(job, "failed", {**body, "retryable": failure.retryable})

    def _release(self, job: Job) -> None:
        job.done.set()
        with self._lock:
            self.jobs.pop(job.id, None)
        self._slot_freed.set()

    def cancel(self, job_id: str) -> None:
        """A stop command: the tool is told, and ended after the grace period."""
        with self._lock:
            job = self.jobs.get(job_id)
        if job is None:
            return
        job.context.cancel()
        if job.future is not None:
            job.future.cancel()
        threading.Thread(target=self._end_after_grace, args=(job,), daemon=True).start()

    def _end_after_grace(self, job: Job) -> None:
        if job.done.wait(self.grace_period):
            return
        if job.thread is not None and job.thread.ident is not None:
            # Raised at its next Python instruction (not inside a blocking C call); its
            # slot is given back once the report is answered, whatever it does.
            ctypes.pythonapi.PyThreadState_SetAsyncExc(
                ctypes.c_ulong(job.thread.ident), ctypes.py_object(Ended)
            )
        self._report_end(job, "stopped", {"signal": "SIGKILL"})

    # ------------------------------------------------------------------ the server
    def _post(self, path: str, body: dict[str, Any], key: str | None = None) -> Any:
        """One POST, retried by the client under one Idempotency-Key (``key``, or a new
        one)."""
        response = self.client.request(
            "POST", path, json=body, idempotency_key=key or str(uuid.uuid4())
        )
        return response.json()

    def _enqueue(self, queued: Queued) -> None:
        with self._queued:
            self._queue.append(queued)
            self._queued.notify()
            if self._reporter is None:
                self._reporter = threading.Thread(
                    target=self._send_reports, name="reports", daemon=True
                )
                self._reporter.start()

    def _running(self) -> bool:
        """Whether a job the worker holds has yet to queue its last report."""
        with self._lock:
            return any(not job.ended for job in self.jobs.values())

    def _send_reports(self) -> None:
        """The reports thread: what is queued, in batches (the module's doc); the jobs
        they end given back once they are answered."""
        while True:
            with self._queued:
                while not self._queue:
                    self._queued.wait()
                deadline = self._queue[0].at + BATCH_WINDOW
                while len(self._queue) < MAX_BATCH and self._running():
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._queued.wait(left)
                batch, self._queue = self._queue[:MAX_BATCH], self._queue[MAX_BATCH:]
            try:
                self._report(batch)
            except Exception:  # a bug of ours must not stop every later report
                logger.exception("reports of %d jobs", len(batch))
            finally:
                for queued in batch:
                    if queued.job is not None:
                        self._release(queued.job)

    def _report(self, batch: list[Queued]) -> None:
        """POST a batch of reports, retried under one Idempotency-Key while the server
        cannot be reached (up to ``REPORT_PATIENCE``); a refusal, of the batch or of a
        report in it, is logged (the job is no longer this worker's: recovered after a
        silence, or stopped)."""
        key = str(uuid.uuid4())
        deadline = time.monotonic() + REPORT_PATIENCE
        delay = 0.5
        reports = [{"job": q.job_id, "kind": q.kind, **q.body} for q in batch]
        while True:
            try:
                answer = self._post(
                    "runner/reports", {"runner_id": self.runner_id, "reports": reports}, key
                )
                break
            except ApiError as exc:
                if (exc.status or 500) < 500 and exc.status != 429:
                    logger.warning("reports of %d jobs refused: %s", len(batch), exc)
                    return
                failed: OrchestratorError = exc
            except OrchestratorError as exc:
                failed = exc
            if time.monotonic() > deadline:
                logger.error("reports of %d jobs lost: %s", len(batch), failed)
                return
            time.sleep(delay)
            delay = min(delay * 2, 10.0)
        for queued, result in zip(batch, answer.get("results", []), strict=False):
            if not result.get("ok"):
                refused = result.get("refused") or {}
                logger.warning(
                    "job %s: report %s refused: %s (%s)",
                    queued.job_id,
                    queued.kind,
                    refused.get("message"),
                    refused.get("code"),
                )

    def _heartbeats(self) -> None:
        last = time.monotonic()
        while not self._stopping.wait(PROGRESS_INTERVAL):
            progress = {}
            for job in self._held():
                value = job.context.last_progress
                if value is not None and value != job.progress_sent:
                    progress[job.id] = value
            if not progress and time.monotonic() - last < self.heartbeat_interval:
                continue
            try:
                self._post("runner/heartbeat", {"runner_id": self.runner_id, "progress": progress})
            except OrchestratorError as exc:
                logger.warning("heartbeat failed: %s", exc)
                continue
            last = time.monotonic()
            for job in self._held():
                if job.id in progress:
                    job.progress_sent = progress[job.id]

    def _uploader(self, job_id: str, saved: list[str]) -> Any:
        """A job's ``Context.upload``: an artifact of the job's step, its id kept in
        ``saved`` for the output."""

        def upload(name: str, stream: IO[bytes], size: int, content_type: str) -> dict[str, Any]:
            artifact = self.client.upload_job_artifact(
                job_id, self.runner_id, name, stream, content_type=content_type or None
            )
            saved.append(str(artifact["id"]))
            return {  # as the fleet's save_artifact describes it
                "id": artifact["id"],
                "name": artifact["name"],
                "size": artifact["size"],
                "sha256": artifact["sha256"],
                "content_type": artifact["content_type"],
            }

        return upload


def serve(modules: list[str], **options: Any) -> None:
    """``orch worker``: a ``Worker`` for the configured server (``orch login``, or
    ``ORCH_URL`` and ``ORCH_API_KEY``), stopped gracefully by SIGINT or SIGTERM."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    sys.path.insert(0, os.getcwd())  # modules of the directory it is started in
    worker = Worker(modules, **options)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        logger.info("stopping (signal %d): claiming nothing more", signum)
        worker.stop()
        if worker.polling:
            # The held poll would answer only at its end (up to 30 s): leave it. A job it
            # claimed meanwhile is recovered when the worker deregisters.
            raise Interrupted

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    worker.run()
