"""How an `orch worker` (orchestrator_client.worker.Worker) serves jobs from the real API
over HTTP: the context it hands a tool (its artifacts those of its step, in S3 through
moto's server mode), an `async` tool in its event loop (its output recorded, a cancel
reaching the coroutine), and the jobs of one poll, ended together, reported in one
request."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import boto3
import httpx
import pytest

from api.models import IdempotencyRecord
from artifacts.models import Artifact
from orchestrator_client import worker as worker_module
from orchestrator_client.tools import Context, tool
from orchestrator_client.worker import Worker
from runs import services
from runs.engine.start import run_start
from runs.models import RunnerJob, Step
from runs.waits import runners
from tests import factories
from tests.artifacts.conftest import s3_server, use_s3
from tests.support import wait_until
from tests.tenants import LiveTenant

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("celery_worker")]
__all__ = ["s3_server"]  # the artifacts tests' moto server, a fixture here too

# Set by ``waits_async`` when asyncio's cancellation reached it.
cancel_seen = threading.Event()


@tool(name="testing.double", version="1")
def double(n: int) -> int:
    """Twice ``n``.

    Args:
        n: the number.
    """
    return 2 * n


@tool(name="testing.where", version="1")
def where(ctx: Context) -> dict[str, Any]:
    """Which attempt of which step this is, as the context says."""
    return {"run": ctx.run_id, "step": ctx.step_id, "attempt": ctx.attempt, "path": ctx.step_path}


@tool(name="testing.report", version="1")
def report(ctx: Context, text: str) -> dict[str, Any]:
    """Save ``text`` as the artifact ``report.txt``.

    Args:
        text: what the report says.
    """
    saved = ctx.upload("report.txt", text.encode(), "text/plain")
    return {"words": len(text.split()), "size": saved["size"]}


@tool(name="testing.shout_async", version="1")
async def shout_async(text: str) -> str:
    """``text`` in capitals, after an await.

    Args:
        text: what to shout.
    """
    await asyncio.sleep(0)
    return text.upper()


@tool(name="testing.wait_async", version="1")
async def wait_async(ctx: Context) -> str:
    """Await until cancelled, saying how far it got; notes the cancel (``cancel_seen``)."""
    try:
        for beat in range(100_000):
            ctx.heartbeat({"beat": beat})
            await asyncio.sleep(0.05)
    except asyncio.CancelledError:
        cancel_seen.set()
        raise
    return "never"


@contextmanager
def serving(worker: Worker) -> Iterator[Worker]:
    """``worker.run()`` in a thread (registered once this enters), stopped on leaving."""
    thread = threading.Thread(target=worker.run, name="worker", daemon=True)
    thread.start()
    wait_until(lambda: worker.runner_id, timeout=20, what="the worker to register")
    try:
        yield worker
    finally:
        worker.stop()
        thread.join(timeout=30)


def parked(
    tenant: LiveTenant,
    count: int,
    tool: str = "testing.double",
    params: Callable[[int], dict[str, Any]] = lambda n: {"n": n},
) -> list[RunnerJob]:
    """A run of ``count`` parallel steps of ``tool`` (``testing.double`` by default),
    the n-th with ``params(n)``, parked by the session's fleet on their jobs."""
    spec = factories.plan(name="doubles")
    spec["agents"][0]["tasks"][0] |= {"mode": "parallel", "max_concurrent_steps": count}
    spec["agents"][0]["tasks"][0]["steps"] = [
        {"name": f"s{n}", "tool": tool, "params": params(n)} for n in range(count)
    ]
    run = services.run_create(organization=tenant.organization, plan=spec)
    run_start(run_id=run.pk)
    jobs = RunnerJob.objects.filter(run=run)  # pending, or claimed by a worker serving
    wait_until(lambda: jobs.count() == count, timeout=30, what="the steps parked")
    return list(jobs.order_by("step__name"))


def test_the_jobs_of_one_poll_are_reported_in_one_request(
    tenant: LiveTenant, monkeypatch: Any
) -> None:
    # No window: the reports wait until no job of the poll is still running.
    monkeypatch.setattr(worker_module, "BATCH_WINDOW", 60.0)
    worker = Worker([double], url=tenant.url, api_key=tenant.key, concurrency=4, poll_wait=0)
    worker.register()  # publishes testing.double, which the plan names
    jobs = parked(tenant, 4)

    worker.poll_once()

    wait_until(
        lambda: (
            RunnerJob.objects.filter(pk__in=[j.pk for j in jobs], status="completed").count() == 4
        ),
        timeout=20,
        what="the four jobs reported",
    )
    outputs = [Step.objects.get(pk=job.step_id).output for job in jobs]
    assert outputs == [0, 2, 4, 6]
    requests = IdempotencyRecord.objects.filter(organization=tenant.organization)
    assert [record.path for record in requests if "/runner/jobs/" in record.path] == []
    batches = [record for record in requests if record.path.endswith("/runner/reports")]
    assert len(batches) == 1
    assert len(batches[0].response_body["results"]) == 4
    wait_until(lambda: not worker.jobs, timeout=5, what="the slots given back")


def test_a_tool_on_a_worker_is_told_its_steps_path_run_and_attempt(tenant: LiveTenant) -> None:
    worker = Worker([where], url=tenant.url, api_key=tenant.key, concurrency=1, poll_wait=0)
    worker.register()
    (job,) = parked(tenant, 1, tool="testing.where", params=lambda n: {})

    worker.poll_once()

    done = wait_until(
        lambda: Step.objects.filter(pk=job.step_id, status="completed").first(),
        timeout=20,
        what="the job reported",
    )
    assert done.output == {
        "run": str(job.run_id),
        "step": job.step_id,
        "attempt": job.attempt,
        "path": "agent-0.task-0.s0",
    }
    wait_until(lambda: not worker.jobs, timeout=5, what="the slot given back")


def test_a_worker_tools_upload_is_an_artifact_of_its_step_listed_in_its_output(
    tenant: LiveTenant, settings: Any, monkeypatch: pytest.MonkeyPatch, s3_server: str
) -> None:
    bucket = use_s3(settings, monkeypatch, s3_server)
    boto3.client("s3", endpoint_url=s3_server, region_name="us-east-1").create_bucket(Bucket=bucket)
    worker = Worker([report], url=tenant.url, api_key=tenant.key, concurrency=1, poll_wait=0)
    worker.register()
    (job,) = parked(tenant, 1, "testing.report", lambda n: {"text": f"report {n} here"})

    worker.poll_once()

    done = wait_until(
        lambda: Step.objects.filter(pk=job.step_id, status="completed").first(),
        timeout=20,
        what="the job reported",
    )
    artifact = Artifact.objects.get(run_id=job.run_id)
    assert (artifact.name, artifact.step_id, artifact.status) == (
        "report.txt",
        job.step_id,
        "available",
    )
    # Listed as the fleet's executor lists a tool's artifacts (orchestrator.executor).
    assert done.output == {"words": 3, "size": 13, "artifacts": [str(artifact.pk)]}
    stored = boto3.client("s3", endpoint_url=s3_server, region_name="us-east-1").get_object(
        Bucket=bucket, Key=artifact.key
    )
    assert stored["Body"].read() == b"report 0 here"
    wait_until(lambda: not worker.jobs, timeout=5, what="the slot given back")


def test_a_runner_may_upload_only_for_a_job_it_holds(
    tenant: LiveTenant, settings: Any, tmp_path: Any
) -> None:
    settings.ARTIFACTS_BACKEND = "filesystem"
    settings.ARTIFACTS_ROOT = str(tmp_path / "artifacts")
    holder = Worker([report], url=tenant.url, api_key=tenant.key, poll_wait=0, hostname="a")
    other = Worker([report], url=tenant.url, api_key=tenant.key, poll_wait=0, hostname="b")
    holder.register()
    other.register()
    (job,) = parked(tenant, 1, "testing.report", lambda n: {"text": "t"})
    claimed = runners.poll(organization=tenant.organization, runner_id=holder.runner_id)
    assert claimed.job is not None
    assert claimed.job.pk == job.pk

    def upload(runner_id: str) -> httpx.Response:
        return httpx.post(
            f"{tenant.url}/api/v1/runner/jobs/{job.pk}/artifacts",
            headers={"Authorization": f"Bearer {tenant.key}"},
            data={"name": f"by-{runner_id}.txt", "runner_id": runner_id},
            files={"file": ("f.txt", b"bytes", "text/plain")},
        )

    refused = upload(other.runner_id)
    taken = upload(holder.runner_id)

    assert (refused.status_code, refused.json()["code"]) == (409, "not_job_owner")
    assert taken.status_code == 201, taken.text
    assert taken.json()["step"] == job.step_id
    assert [a.name for a in Artifact.objects.filter(run_id=job.run_id)] == [
        f"by-{holder.runner_id}.txt"
    ]


def test_an_async_tool_on_a_worker_has_its_output_recorded(tenant: LiveTenant) -> None:
    worker = Worker([shout_async], url=tenant.url, api_key=tenant.key, concurrency=2, poll_wait=0)
    worker.register()
    jobs = parked(tenant, 2, "testing.shout_async", lambda n: {"text": f"step {n}"})

    worker.poll_once()

    wait_until(
        lambda: (
            Step.objects.filter(pk__in=[j.step_id for j in jobs], status="completed").count() == 2
        ),
        timeout=20,
        what="both jobs reported",
    )
    assert [Step.objects.get(pk=j.step_id).output for j in jobs] == ["STEP 0", "STEP 1"]
    assert RunnerJob.objects.get(pk=jobs[0].pk).result == "STEP 0"
    wait_until(lambda: not worker.jobs, timeout=5, what="the slots given back")


def test_a_cancel_reaches_an_async_tools_coroutine_on_a_worker(tenant: LiveTenant) -> None:
    cancel_seen.clear()
    worker = Worker([wait_async], url=tenant.url, api_key=tenant.key, grace_period=10, poll_wait=1)
    with serving(worker):
        (job,) = parked(tenant, 1, "testing.wait_async", lambda n: {})
        wait_until(
            lambda: RunnerJob.objects.filter(pk=job.pk, progress__beat__gte=1).first(),
            timeout=30,
            what="the coroutine's progress to reach the server",
        )

        services.run_cancel(run_id=job.run_id)

        stopped = wait_until(
            lambda: RunnerJob.objects.filter(pk=job.pk, status="stopped").first(),
            timeout=30,
            what="the job to be stopped",
        )
    assert cancel_seen.is_set()
    # Ended by the cancel within its grace, not ended after it.
    assert stopped.signal == "SIGTERM"
    assert Step.objects.get(pk=job.step_id).status == "cancelled"
