"""``runner_jobs``: jobs served on a host, by one ``orch worker`` (concurrency 8, claiming
up to its free slots per poll) and, beside it, by the reference runner (``python -m
orchestrator.runner``, a process per job, concurrency 8), each of one organization.

A run of ``JOBS`` parallel steps (``bench.noop``, a no-op ``@tool``, or a `runner` step
whose command is ``true``) is started once the worker has registered and served a warm-up
run; the figures come from the jobs' rows: ``claim_to_report`` is the time from a job's
claim (``claimed_at``, PostgreSQL's clock) to the report that ended it (``completed_at``):
the poll's answer reaching the worker, the ``started`` report, the call and the
``completed`` report, with the tool costing nothing; ``jobs_per_s`` is the jobs over the
time from the first claim to the last report. The run's wall time includes the fleet
parking each step on its job.
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from billing.services import api_key_create
from runs.models import Runner, RunnerJob

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
        command = [sys.executable, "-m", "orchestrator.runner", "--url", url, "--api-key", key,
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
        engine.organization = organization
        engine.run(jobs_plan(CONCURRENCY, reference), CONCURRENCY)  # warm-up, untimed
        sample = engine.run(jobs_plan(width, reference), width)
        if sample.wall_s is None:
            return sample
        rows = list(
            RunnerJob.objects.filter(
                run__name=f"bench-runner-jobs-{width}", organization=organization
            ).values_list("claimed_at", "completed_at")
        )
        ended = [(claimed, done) for claimed, done in rows if claimed and done]
        if len(ended) != width:
            raise ScenarioFailed(f"{len(ended)} of {width} jobs claimed and reported")
        spans = [(done - claimed).total_seconds() for claimed, done in ended]
        first = min(claimed for claimed, _ in ended)
        last = max(done for _, done in ended)
        extra = {
            "p50_claim_to_report_ms": statistics.median(spans) * 1000,
            "p95_claim_to_report_ms": statistics.quantiles(spans, n=20)[-1] * 1000,
            "jobs_per_s": len(ended) / max((last - first).total_seconds(), 1e-9),
        }
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
