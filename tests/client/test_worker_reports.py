"""How an `orch worker` (orchestrator_client.worker.Worker) serves jobs from the real API
over HTTP: the context it hands a tool, and the jobs of one poll, ended together,
reported in one request."""

from __future__ import annotations

from typing import Any

import pytest

from api.models import IdempotencyRecord
from orchestrator_client import worker as worker_module
from orchestrator_client.tools import Context, tool
from orchestrator_client.worker import Worker
from runs import services
from runs.engine.start import run_start
from runs.models import RunnerJob, Step
from tests import factories
from tests.client.conftest import Tenant
from tests.support import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("celery_worker")]


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


def parked(tenant: Tenant, count: int, tool: str = "testing.double") -> list[RunnerJob]:
    """A run of ``count`` parallel steps of ``tool`` (``testing.double`` by default),
    parked by the session's fleet on their jobs."""
    spec = factories.plan(name="doubles")
    spec["agents"][0]["tasks"][0] |= {"mode": "parallel", "max_concurrent_steps": count}
    spec["agents"][0]["tasks"][0]["steps"] = [
        {"name": f"s{n}", "tool": tool, "params": {"n": n} if tool == "testing.double" else {}}
        for n in range(count)
    ]
    run = services.run_create(organization=tenant.organization, plan=spec)
    run_start(run_id=run.pk)
    jobs = RunnerJob.objects.filter(run=run, status="pending")
    wait_until(lambda: jobs.count() == count, timeout=30, what="the steps parked")
    return list(jobs.order_by("step__name"))


def test_the_jobs_of_one_poll_are_reported_in_one_request(tenant: Tenant, monkeypatch: Any) -> None:
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


def test_a_tool_on_a_worker_is_told_its_steps_path_run_and_attempt(tenant: Tenant) -> None:
    worker = Worker([where], url=tenant.url, api_key=tenant.key, concurrency=1, poll_wait=0)
    worker.register()
    (job,) = parked(tenant, 1, tool="testing.where")

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
