"""The reference runner:
``python -m orchestrator_client.runner --url URL --api-key KEY --command CMD``.

It needs the HTTP API only (the client package, no server code): it registers, long-polls
for jobs, runs ``CMD`` once per job as a subprocess (the job as JSON on stdin,
``ORCH_JOB_ID``, ``ORCH_PROMPT``, ``ORCH_RUN_ID``, ``ORCH_URL`` and ``ORCH_API_KEY`` in its
environment), reports what happened and
heartbeats. Exit 0 completes the job with stdout parsed as JSON (``{"stdout": text}``
when it is not JSON); another exit fails it with the tail of stderr. A stop command sends
SIGTERM, then SIGKILL after ``--kill-after`` seconds, and reports the signal used.
SIGINT or SIGTERM to the runner stops its jobs the same way, deregisters and exits. When
the server cannot be reached it tries again with backoff; a report is retried under the
same ``Idempotency-Key`` so that it is applied once. The protocol: docs/runners.md.
Its job's span continues the step attempt's trace when ``OTEL_EXPORTER_OTLP_ENDPOINT`` is
set (``orchestrator_client.tracing``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from types import FrameType
from typing import TYPE_CHECKING, Any

import httpx

from orchestrator_client import tracing
from orchestrator_client.http import API_PREFIX, api_root, retry_after_seconds

if TYPE_CHECKING:
    from opentelemetry.trace import Span

logger = logging.getLogger("orchestrator_client.runner")

STDERR_TAIL = 4000  # characters of stderr a failure report carries


class Deregistered(Exception):
    """The server says this runner is deregistered: stop polling."""


class Interrupted(Exception):
    """SIGINT or SIGTERM arrived while the runner waited on its poll."""


@dataclass
class Job:
    id: str
    process: subprocess.Popen[bytes]
    stop_signal: str = ""  # the signal that ended it, when it was stopped
    span: Span | None = None  # its span in the run's trace (tracing on)


@dataclass
class Runner:
    url: str
    api_key: str
    command: list[str]
    hostname: str
    project_dir: str
    executor_type: str
    tags: list[str] = field(default_factory=list)
    concurrency: int = 1
    kill_after: float = 5.0
    poll_wait: int = 30
    runner_id: str = ""
    heartbeat_interval: float = 60.0
    jobs: dict[str, Job] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    stopping: threading.Event = field(default_factory=threading.Event)
    # True while the main thread waits on a poll: a signal then interrupts the wait.
    polling: bool = False

    def __post_init__(self) -> None:
        self.url = api_root(self.url)
        self.client = httpx.Client(
            base_url=self.url + API_PREFIX,
            headers={"Authorization": f"Bearer {self.api_key}"},
            timeout=httpx.Timeout(10.0, read=self.poll_wait + 15.0),
        )

    # ---------------------------------------------------------------- HTTP
    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """One request, retried with backoff while the server is unreachable or
        answers 5xx (and the runner is not shutting down)."""
        delay = 0.5
        while True:
            try:
                response = self.client.request(method, path, **kwargs)
                if response.status_code < 500:
                    return response
                logger.warning("%s %s: %s; retrying", method, path, response.status_code)
            except httpx.TransportError as exc:
                logger.warning("%s %s: %s; retrying in %.1fs", method, path, exc, delay)
            if self.stopping.is_set() and method == "GET":
                raise Deregistered("shutting down")
            time.sleep(delay)
            delay = min(delay * 2, 30.0)

    def _post(self, path: str, body: dict[str, Any]) -> httpx.Response:
        # The same key on every try: a report the server applied before the connection
        # dropped is replayed, not applied twice.
        headers = {"Idempotency-Key": f"runner-{uuid.uuid4()}"}
        return self._request("POST", path, json=body, headers=headers)

    # ---------------------------------------------------------------- lifecycle
    def register(self) -> None:
        body = {
            "hostname": self.hostname,
            "project_dir": self.project_dir,
            "executor_type": self.executor_type,
            "tags": self.tags,
        }
        delay = 1.0
        while True:
            response = self._post("/runner/register", body)
            if response.status_code == 201:
                data = response.json()
                self.runner_id = data["runner_id"]
                self.poll_wait = min(self.poll_wait, int(data["poll_timeout_seconds"]))
                self.heartbeat_interval = float(data["heartbeat_interval_seconds"])
                logger.info("registered as %s", self.runner_id)
                return
            if response.status_code != 409:
                raise SystemExit(f"registration refused: {response.status_code} {response.text}")
            # The same identity is still online (a previous process that did not
            # deregister): it goes stale without heartbeats, then this one reconnects.
            logger.warning("runner identity still online; registering again in %.0fs", delay)
            if self.stopping.wait(delay):
                raise SystemExit("stopped before registering")
            delay = min(delay * 2, 30.0)

    def run(self) -> None:
        self.register()
        threading.Thread(target=self._heartbeats, name="heartbeat", daemon=True).start()
        try:
            while not self.stopping.is_set():
                self._poll_once()
        except Deregistered:
            logger.info("deregistered by the server")
        except Interrupted:
            pass
        finally:
            self.shutdown()

    def _poll_once(self) -> None:
        with self.lock:
            free = len(self.jobs) < self.concurrency
        # With no free slot the poll still runs (stop commands), without waiting long.
        wait = self.poll_wait if free else 1
        self.polling = True
        try:
            response = self._request(
                "GET", "/runner/jobs", params={"runner_id": self.runner_id, "wait": wait}
            )
        finally:
            self.polling = False
        if response.status_code == 204:
            if not free:
                self._reap_wait()
            return
        if response.status_code == 429:
            # The organization holds as many polls as its quota allows (too_many_polls):
            # poll again once a place may be free, as the server says.
            wait_s = retry_after_seconds(response.headers.get("Retry-After")) or 5.0
            logger.warning("poll: %s; polling again in %.0fs", response.text, wait_s)
            self.stopping.wait(min(max(wait_s, 1.0), 60.0))
            return
        if response.status_code != 200:
            logger.error("poll: %s %s", response.status_code, response.text)
            self.stopping.wait(1.0)
            return
        data = response.json()
        if data.get("deregistered"):
            raise Deregistered()
        for job_id in data.get("stop_jobs", []):
            # In its own thread: SIGKILL comes only after kill_after, and polling goes on.
            threading.Thread(target=self.stop, args=(str(job_id),), daemon=True).start()
        if "job" in data:
            self.start(data["job"])

    def _reap_wait(self) -> None:
        time.sleep(0.2)

    def _heartbeats(self) -> None:
        while not self.stopping.wait(self.heartbeat_interval):
            response = self._post("/runner/heartbeat", {"runner_id": self.runner_id})
            if response.status_code != 200:
                logger.warning("heartbeat: %s %s", response.status_code, response.text)

    def shutdown(self) -> None:
        """Stop every job (reporting each), then deregister."""
        self.stopping.set()
        with self.lock:
            job_ids = list(self.jobs)
        threads = [threading.Thread(target=self.stop, args=(job_id,)) for job_id in job_ids]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if self.runner_id:
            self._post("/runner/deregister", {"runner_id": self.runner_id})
            logger.info("deregistered %s", self.runner_id)

    # ---------------------------------------------------------------- jobs
    def start(self, job: dict[str, Any]) -> None:
        # With the API's address and key, the command can upload what it makes as
        # artifacts of the job's run (docs/artifacts.md) and name them in its result.
        env = {
            **os.environ,
            "ORCH_JOB_ID": str(job["id"]),
            "ORCH_PROMPT": str(job["prompt"]),
            "ORCH_RUN_ID": str(job.get("run", "")),
            "ORCH_URL": self.url,
            "ORCH_API_KEY": self.api_key,
        }
        # The job continues its step attempt's trace (docs/observability.md); the
        # command may continue it too, from TRACEPARENT (the W3C environment carrier).
        span = tracing.start(
            "runner job",
            traceparent=str(job.get("traceparent") or ""),
            attributes={
                "orchestrator.runner_job.id": str(job["id"]),
                "orchestrator.run.id": str(job.get("run", "")),
                "orchestrator.step.id": job.get("step") or 0,
                "orchestrator.runner.id": self.runner_id,
                "orchestrator.runner_job.type": str(job.get("type", "")),
            },
        )
        if traceparent := tracing.traceparent_of(span):
            env["TRACEPARENT"] = traceparent
        process = subprocess.Popen(
            self.command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            cwd=job.get("project_dir") or None,
            start_new_session=True,  # its own process group: a stop reaches its children
        )
        running = Job(str(job["id"]), process, span=span)
        with self.lock:
            self.jobs[running.id] = running
        self._post(f"/runner/jobs/{running.id}/started", {"runner_id": self.runner_id})
        threading.Thread(target=self._supervise, args=(running, job), daemon=True).start()

    def _supervise(self, job: Job, payload: dict[str, Any]) -> None:
        stdout, stderr = job.process.communicate(json.dumps(payload).encode())
        with self.lock:
            self.jobs.pop(job.id, None)
        body: dict[str, Any] = {"runner_id": self.runner_id}
        if job.stop_signal:
            body["signal"] = job.stop_signal
            self._post(f"/runner/jobs/{job.id}/stopped", body)
        elif job.process.returncode == 0:
            text = stdout.decode(errors="replace")
            try:
                body["result"] = json.loads(text)
            except ValueError:
                body["result"] = {"stdout": text}
            self._post(f"/runner/jobs/{job.id}/completed", body)
        else:
            tail = stderr.decode(errors="replace")[-STDERR_TAIL:]
            body["error"] = tail or f"exited with status {job.process.returncode}"
            self._post(f"/runner/jobs/{job.id}/failed", body)
        code = job.process.returncode
        attributes: dict[str, Any] = {"process.exit.code": code}
        if job.stop_signal:
            attributes["orchestrator.runner_job.signal"] = job.stop_signal
        failed = f"exit {code}" if code != 0 and not job.stop_signal else ""
        tracing.end(job.span, attributes, error=failed)

    def stop(self, job_id: str) -> None:
        """SIGTERM to the job's process group, SIGKILL if it outlives ``kill_after``."""
        with self.lock:
            job = self.jobs.get(job_id)
        if job is None or job.stop_signal:
            return  # not ours (any more), or being stopped already
        job.stop_signal = "SIGTERM"
        _signal_group(job.process, signal.SIGTERM)
        try:
            job.process.wait(self.kill_after)
        except subprocess.TimeoutExpired:
            job.stop_signal = "SIGKILL"
            _signal_group(job.process, signal.SIGKILL)


def _signal_group(process: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):  # it ended meanwhile
        os.killpg(process.pid, sig)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m orchestrator_client.runner", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--url", required=True, help="the orchestrator, e.g. http://127.0.0.1:8000")
    parser.add_argument("--api-key", required=True, help="a key of scope runner (or full)")
    parser.add_argument("--command", required=True, help="what runs each job (split like a shell)")
    parser.add_argument("--tags", default="", help="comma-separated capability tags")
    parser.add_argument("--hostname", default=socket.gethostname())
    parser.add_argument("--project-dir", default=os.getcwd())
    parser.add_argument("--executor-type", default="command")
    parser.add_argument("--concurrency", type=int, default=1, help="jobs at once (default 1)")
    parser.add_argument("--kill-after", type=float, default=5.0, help="SIGTERM to SIGKILL, s")
    args = parser.parse_args(argv)
    if args.concurrency < 1 or args.kill_after <= 0:
        parser.error("--concurrency must be at least 1 and --kill-after positive")
    if not shlex.split(args.command):
        parser.error("--command is empty")
    try:
        args.url = api_root(args.url)
    except ValueError as exc:
        parser.error(str(exc))
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s runner %(levelname)s %(message)s")
    tracing.setup("orchestrator-runner", "runner")
    runner = Runner(
        url=args.url,
        api_key=args.api_key,
        command=shlex.split(args.command),
        hostname=args.hostname,
        project_dir=args.project_dir,
        executor_type=args.executor_type,
        tags=[tag.strip() for tag in args.tags.split(",") if tag.strip()],
        concurrency=args.concurrency,
        kill_after=args.kill_after,
    )

    def on_signal(signum: int, frame: FrameType | None) -> None:
        logger.info("signal %s: stopping jobs and deregistering", signum)
        runner.stopping.set()
        if runner.polling:
            raise Interrupted()  # out of the held poll now, not when it answers

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        runner.run()
    finally:
        tracing.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
