"""The runner protocol for an `orch worker` (docs/tools.md): registering with tools,
claiming only their jobs at their versions, several at once, progress in heartbeats, and
failures reported with the tool's own error code."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.tools.packages import remote
from runs import catalogue
from runs.engine.outcomes import Outcome, record
from runs.models import NO_WORKER_OFFERS_TOOL, Runner, RunnerJob, Step
from runs.transitions import claim_step
from runs.waits import runners
from tests import factories
from tests.api import states
from tests.tenants import Tenant

pytestmark = pytest.mark.django_db


def definition(name: str = "acme.summarize", version: str = "1", **properties: Any) -> Any:
    return {
        "name": name,
        "version": version,
        "description": "",
        "params_schema": {
            "type": "object",
            "properties": properties or {"text": {"type": "string"}},
            "additionalProperties": False,
        },
        "output_schema": {},
        "cost": {},
    }


def worker(tenant: Tenant, hostname: str, *tools: Any, tags: list[str] | None = None) -> str:
    response = tenant.post(
        "/api/v1/runner/register",
        {
            "hostname": hostname,
            "project_dir": "/srv",
            "executor_type": "orch-worker",
            "tags": tags or [],
            "tools": list(tools) or [definition()],
        },
    )
    assert response.status_code == 201, response.json()
    return str(response.json()["runner_id"])


def tool_job(tenant: Tenant, params: dict[str, Any], tool: str = "acme.summarize") -> RunnerJob:
    """A step of a worker tool, run by the fleet as a worker would: parked on its job."""
    spec = factories.plan(name="worker-tool")
    spec["agents"][0]["tasks"][0]["steps"] = [{"name": "s", "tool": tool, "params": params}]
    run = states.running_plan(tenant.organization, spec)
    step = Step.objects.get(run=run, name="s")
    claimed = claim_step(step.pk, worker="test", task_id="test", lease_seconds=60)
    assert claimed is not None
    wait = remote(tool).run(params, None)  # type: ignore[arg-type,misc]
    record(step.pk, run.pk, claimed["attempts"], Outcome(wait=wait.wait))
    return RunnerJob.objects.get(step=step)


def poll(tenant: Tenant, runner_id: str, **query: Any) -> Any:
    return tenant.get("/api/v1/runner/jobs", {"runner_id": runner_id, "wait": 0, **query})


def test_a_worker_registers_its_tools_and_they_are_listed_with_it(tenant: Tenant) -> None:
    runner_id = worker(tenant, "host-a", definition(), tags=["gpu"])

    tool = tenant.get("/api/v1/tools/acme.summarize").json()

    assert Runner.objects.get(pk=runner_id).tools == {"acme.summarize": "1"}
    assert (tool["placement"], tool["version"]) == ("worker", "1")
    assert [(o["worker"], o["hostname"], o["tags"]) for o in tool["offered_by"]] == [
        (runner_id, "host-a", ["gpu"])
    ]


def test_a_worker_cannot_offer_a_fleet_tool_nor_change_a_published_version(
    tenant: Tenant,
) -> None:
    catalogue.publish(
        organization=None, definitions=[catalogue.definition_from(definition("acme.x"))], by="w"
    )
    worker(tenant, "host-a", definition())

    taken = tenant.post(
        "/api/v1/runner/register",
        {
            "hostname": "b",
            "project_dir": "/",
            "executor_type": "e",
            "tools": [definition("acme.x")],
        },
    )
    changed = tenant.post(
        "/api/v1/runner/register",
        {
            "hostname": "c",
            "project_dir": "/",
            "executor_type": "e",
            "tools": [definition(words={"type": "integer"})],
        },
    )

    assert (taken.status_code, taken.json()["code"]) == (409, "tool_name_taken")
    assert (changed.status_code, changed.json()["code"]) == (409, "tool_version_conflict")
    assert not Runner.objects.filter(hostname__in=["b", "c"]).exists()


def test_a_step_parks_on_a_job_of_its_tool_and_waits_while_no_worker_offers_it(
    tenant: Tenant,
) -> None:
    runner_id = worker(tenant, "host-a")
    runners.deregister(organization=tenant.organization, runner_id=runner_id)

    job = tool_job(tenant, {"text": "hello", "demands": {"tags": ["gpu"]}})

    assert (job.tool, job.tool_version, job.params) == ("acme.summarize", "1", {"text": "hello"})
    assert job.demands == {"tags": ["gpu"]}
    step = Step.objects.get(pk=job.step_id)
    assert (step.status, step.waiting_reason) == ("running", NO_WORKER_OFFERS_TOOL)
    shown = tenant.get(f"/api/v1/runs/{job.run_id}/steps").json()["results"][0]
    assert shown["waiting_reason"] == NO_WORKER_OFFERS_TOOL


def test_only_a_worker_offering_the_tool_at_the_jobs_version_claims_it(tenant: Tenant) -> None:
    reference = states.runner(tenant.organization)  # a command runner: offers no tool
    other = worker(tenant, "host-b", definition("acme.other"))
    old = worker(tenant, "host-old")  # acme.summarize 1
    job = tool_job(tenant, {"text": "hello"})
    worker(tenant, "host-new", definition(version="2", text={"type": "string"}, n={}))
    newer = tool_job(tenant, {"text": "hello", "n": 1})

    assert poll(tenant, reference.pk).status_code == 204
    assert poll(tenant, other).status_code == 204
    assert poll(tenant, worker(tenant, "host-c", definition("acme.other", "2"))).status_code == 204
    claimed = poll(tenant, old).json()["job"]

    assert (claimed["id"], claimed["tool"], claimed["params"]) == (
        str(job.pk),
        "acme.summarize",
        {"text": "hello"},
    )
    assert newer.tool_version == "2"
    assert poll(tenant, old).status_code == 204  # version 2's job waits for version 2


def test_a_poll_claims_up_to_its_free_slots_at_once_and_clears_the_wait(tenant: Tenant) -> None:
    gone = worker(tenant, "host-a")
    runners.deregister(organization=tenant.organization, runner_id=gone)
    jobs = [tool_job(tenant, {"text": str(n)}) for n in range(3)]
    runner_id = worker(tenant, "host-b")

    first = poll(tenant, runner_id, max_jobs=2).json()["jobs"]
    second = poll(tenant, runner_id, max_jobs=2).json()["jobs"]

    assert [job["id"] for job in first + second] == [str(job.pk) for job in jobs]
    assert poll(tenant, runner_id, max_jobs=0).status_code == 204
    assert not Step.objects.filter(waiting_reason=NO_WORKER_OFFERS_TOOL).exists()


def test_a_heartbeat_keeps_the_progress_of_the_jobs_the_worker_holds(tenant: Tenant) -> None:
    runner_id = worker(tenant, "host-a")
    job = tool_job(tenant, {"text": "x"})
    poll(tenant, runner_id)
    other = worker(tenant, "host-b")

    beat = tenant.post(
        "/api/v1/runner/heartbeat",
        {"runner_id": runner_id, "progress": {str(job.pk): {"done": 3, "of": 10}}},
    )
    tenant.post(
        "/api/v1/runner/heartbeat",
        {"runner_id": other, "progress": {str(job.pk): "not mine"}},
    )
    bad = tenant.post("/api/v1/runner/heartbeat", {"runner_id": runner_id, "progress": {"x": 1}})

    assert beat.status_code == 200
    shown = tenant.get(f"/api/v1/runner-jobs/{job.pk}").json()
    assert shown["progress"] == {"done": 3, "of": 10}
    assert (bad.status_code, bad.json()["details"][0]["path"]) == (400, "progress")


def test_a_failure_reported_with_the_tools_code_fails_the_attempt_with_it(
    tenant: Tenant,
) -> None:
    runner_id = worker(tenant, "host-a")
    job = tool_job(tenant, {"text": "x"})
    poll(tenant, runner_id)
    body = {"runner_id": runner_id, "error": "no such text", "code": "not_found"}

    first = tenant.post(f"/api/v1/runner/jobs/{job.pk}/failed", {**body, "retryable": False})
    again = tenant.post(f"/api/v1/runner/jobs/{job.pk}/failed", {**body, "retryable": False})
    unknown = tenant.post(f"/api/v1/runner/jobs/{job.pk}/failed", {**body, "code": "oops"})

    assert (first.status_code, again.status_code, unknown.status_code) == (200, 200, 400)
    step = Step.objects.get(pk=job.step_id)
    assert step.status == "failed"
    error = step.error or {}
    assert (error["code"], error["message"], error["retryable"]) == (
        "not_found",
        "no such text",
        False,
    )


def test_a_job_names_its_steps_path_wherever_a_runner_or_a_client_reads_it(
    tenant: Tenant,
) -> None:
    runner_id = worker(tenant, "host-a")
    first, second = tool_job(tenant, {"text": "1"}), tool_job(tenant, {"text": "2"})
    path = "agent-0.task-0.s"  # factories.plan's agent and task, tool_job's step

    one = poll(tenant, runner_id).json()["job"]
    many = poll(tenant, runner_id, max_jobs=5).json()["jobs"]
    shown = tenant.get(f"/api/v1/runner-jobs/{first.pk}").json()
    listed = tenant.get("/api/v1/runner-jobs").json()["results"]
    stopped = tenant.post(f"/api/v1/runner-jobs/{second.pk}/stop", {}).json()

    assert [job["step_path"] for job in [one, *many, shown, *listed, stopped]] == [path] * 6
    assert (one["id"], many[0]["id"]) == (str(first.pk), str(second.pk))


def test_a_worker_tools_progress_and_job_are_read_with_its_step(tenant: Tenant) -> None:
    runner_id = worker(tenant, "host-a")
    job = tool_job(tenant, {"text": "x"})
    steps = f"/api/v1/runs/{job.run_id}/steps"
    before = tenant.get(steps).json()["results"][0]
    poll(tenant, runner_id)

    tenant.post(
        "/api/v1/runner/heartbeat",
        {"runner_id": runner_id, "progress": {str(job.pk): {"done": 3, "of": 10}}},
    )

    shown = tenant.get(steps).json()["results"][0]
    assert (before["job"], before["progress"]) == (str(job.pk), None)
    assert (shown["job"], shown["progress"]) == (str(job.pk), {"done": 3, "of": 10})
