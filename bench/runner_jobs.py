"""``runner_jobs``: jobs served on a host, by one ``orch worker`` (concurrency 8, claiming
up to its free slots per poll) and, beside it, by the reference runner (``python -m
orchestrator_client.runner``, a process per job, concurrency 8), each of one organization.

A run of ``JOBS`` parallel steps (``bench.noop``, a no-op ``@tool``, or a `runner` step
whose command is ``true``) is started once the worker has registered and served a warm-up
run; the figures come from the jobs' rows: ``claim_to_report`` is the time from a job's
claim (``claimed_at``, PostgreSQL's clock) to the report that ended it (``completed_at``):
the poll's answer reaching the worker, the call and the report that ended it (an ``orch
worker`` sends several in one request), with the tool costing nothing; ``jobs_per_s`` is
the jobs over the time from the first claim to the last report. The run's wall time
includes the fleet parking each step on its job: ``p50_park_ms`` is the fleet's part,
from its claim of a step (the step's ``started_at``) to the job's creation. With the
engine's CPU meter (``bench.run.cpu_meter``), ``cpu_ms_<owner>`` say where the CPU of a
job went over the timed run, ``host`` being the serving process and its children.

Every API worker answers a few untimed polls first (``_warm``): a gunicorn worker
imports the API's modules on its first request, and a runner's few connections would
leave most of them cold for the timed run.
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from billing.services import api_key_create
from runs.models import Runner, RunnerJob

from .procs import CpuMeter, tree_seconds

if TYPE_CHECKING:
    from .scenarios import Engine, Sample

JOBS = 400
CONCURRENCY = 8
ROOT = Path(__file__).resolve().parent.parent


def jobs_plan(width: int, reference: bool) -> dict[str, Any]:
    step: dict[str, Any] = (
        {"tool": "runner", "params": {"prompt": "noop"}}
        if reference
        else {"tool": "bench.noop", "params": {}}
    )
    return {
        "name": f"bench-runner-jobs-{width}",
        "agents": [
            {
                "name": "agent",
                "tasks": [
                    {
                        "name": "jobs",
                        "mode": "parallel",
                        "max_concurrent_steps": width,
                        "steps": [
                            {"name": f"j{i}", "timeout": "10m", **step} for i in range(width)
                        ],
                    }
                ],
            }
        ],
    }


def _serving(url: str, key: str, reference: bool, log: Path) -> subprocess.Popen[bytes]:
    if reference:
        command = [sys.executable, "-m", "orchestrator_client.runner",
                   "--url", url, "--api-key", key,
                   "--command", "true", "--concurrency", str(CONCURRENCY),
                   "--hostname", "bench-reference"]  # fmt: skip
    else:
        orch = str(Path(sys.executable).parent / "orch")
        command = [orch, "worker", "bench.tools", "--concurrency", str(CONCURRENCY),
                   "--hostname", "bench-worker"]  # fmt: skip
    env = {**os.environ, "ORCH_URL": url, "ORCH_API_KEY": key}
    return subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT
    )


def _warm(url: str, key: str, runner_id: str, workers: int) -> None:
    """Polls that find nothing (``wait=0``), from as many fresh connections at once as
    the web workers times four, so that each worker answers some."""
    import httpx

    def polls(_: int) -> None:
        with httpx.Client(base_url=url, trust_env=False, timeout=30) as client:
            for _ in range(3):
                client.get(
                    "/api/v1/runner/jobs",
                    params={"runner_id": runner_id, "wait": 0, "max_jobs": 0},
                    headers={"Authorization": f"Bearer {key}"},
                )

    with ThreadPoolExecutor(max_workers=4 * workers) as pool:
        list(pool.map(polls, range(4 * workers)))


def runner_jobs(engine: Engine, *, reference: bool = False, width: int = JOBS) -> Sample:
    """One host serving ``width`` jobs (the module's doc)."""
    from .scenarios import Sample, ScenarioFailed, _describe, _organization

    if engine.web is None:
        return Sample(width, error="no web server to serve runners (Engine(web=...))")
    process: subprocess.Popen[bytes] | None = None
    previous = engine.organization
    try:
        url = engine.web.url()
        organization = _organization()
        _, key = api_key_create(organization=organization, name="bench", scope="runner")
        log = engine.web.stack.directory / ("runner.log" if reference else "orch-worker.log")
        process = _serving(url, key, reference, log)
        deadline = time.perf_counter() + 60
        while not Runner.objects.filter(organization=organization).exists():
            if process.poll() is not None or time.perf_counter() > deadline:
                raise ScenarioFailed(f"the runner did not register (see {log})")
            time.sleep(0.05)
        runner = Runner.objects.filter(organization=organization).get()
        _warm(url, key, runner.pk, engine.web.workers)
        engine.organization = organization
        engine.run(jobs_plan(CONCURRENCY, reference), CONCURRENCY)  # warm-up, untimed
        before = {**engine._reading(), "host": tree_seconds(process.pid)}
        sample = engine.run(jobs_plan(width, reference), width)
        if sample.wall_s is None:
            return sample
        after = {**engine._reading(), "host": tree_seconds(process.pid)}
        rows = list(
            RunnerJob.objects.filter(
                run__name=f"bench-runner-jobs-{width}", organization=organization
            ).values_list("step__started_at", "created_at", "claimed_at", "completed_at")
        )
        ended = [(claimed, done) for _, _, claimed, done in rows if claimed and done]
        if len(ended) != width:
            raise ScenarioFailed(f"{len(ended)} of {width} jobs claimed and reported")
        spans = [(done - claimed).total_seconds() for claimed, done in ended]
        first = min(claimed for claimed, _ in ended)
        last = max(done for _, done in ended)
        extra = {
            "p50_claim_to_report_ms": statistics.median(spans) * 1000,
            "p95_claim_to_report_ms": statistics.quantiles(spans, n=20)[-1] * 1000,
            "jobs_per_s": len(ended) / max((last - first).total_seconds(), 1e-9),
            "p50_park_ms": statistics.median(
                (created - parked_from).total_seconds()
                for parked_from, created, _, _ in rows
                if parked_from is not None
            )
            * 1000,
        }
        if engine.meter is not None:
            extra |= CpuMeter.per_unit(before, after, width, sample.wall_s)
        return Sample(width, wall_s=sample.wall_s, extra=extra)
    except Exception as exc:  # noqa: BLE001 - a failure is a figure too
        return Sample(width, error=_describe(exc))
    finally:
        engine.organization = previous
        if process is not None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
