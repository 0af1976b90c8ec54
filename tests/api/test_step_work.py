"""A step names the work it started elsewhere (`job`, `child_run`) while it runs, and the
organization's runner jobs can be listed and filtered (GET /runner-jobs)."""

from __future__ import annotations

from typing import Any

import pytest

from runs.models import RunnerJob, Step
from tests import factories
from tests.api import states
from tests.tenants import Tenant

pytestmark = pytest.mark.django_db


def steps_of(tenant: Tenant, run_id: Any, **params: Any) -> dict[str, dict[str, Any]]:
    response = tenant.get(f"/api/v1/runs/{run_id}/steps", params)
    assert response.status_code == 200, response.content
    return {step["name"]: step for step in response.json()["results"]}


def test_a_runner_step_names_its_job_while_it_runs(tenant: Tenant) -> None:
    job = states.runner_job(tenant.organization)

    step = steps_of(tenant, job.run_id)["agent"]

    assert step["status"] == "running"
    assert step["job"] == str(job.pk)
    assert step["child_run"] is None
    # The job it names is the one a client reads and stops.
    assert tenant.get(f"/api/v1/runner-jobs/{step['job']}").json()["step"] == step["id"]


def test_a_run_step_names_its_child_run_while_it_waits_for_it(tenant: Tenant) -> None:
    step, child = states.child_step(tenant.organization)

    shown = steps_of(tenant, step.run_id)["delegate"]

    assert shown["status"] == "running"
    assert shown["child_run"] == str(child.pk)
    assert shown["job"] is None


def test_other_steps_and_steps_not_started_name_nothing(tenant: Tenant) -> None:
    run = states.running(tenant.organization)

    steps = steps_of(tenant, run.pk)

    assert steps
    assert all(step["job"] is None and step["child_run"] is None for step in steps.values())


def test_the_steps_list_filters_by_tool(tenant: Tenant) -> None:
    job = states.runner_job(tenant.organization)

    assert list(steps_of(tenant, job.run_id, tool="runner")) == ["agent"]
    assert steps_of(tenant, job.run_id, tool="noop") == {}


# --------------------------------------------------------------------------- the job list
def jobs(tenant: Tenant, **params: Any) -> list[dict[str, Any]]:
    response = tenant.get("/api/v1/runner-jobs", params)
    assert response.status_code == 200, response.content
    rows: list[dict[str, Any]] = response.json()["results"]
    return rows


def ids(rows: list[dict[str, Any]]) -> set[str]:
    return {row["id"] for row in rows}


def test_the_job_list_shows_the_organizations_jobs_newest_first(tenant: Tenant) -> None:
    first = states.runner_job(tenant.organization)
    second = states.runner_job(tenant.organization)

    listed = tenant.get("/api/v1/runner-jobs").json()

    assert listed["count"] == 2
    assert [row["id"] for row in listed["results"]] == [str(second.pk), str(first.pk)]


def test_the_job_list_filters_by_run_step_status_and_runner(tenant: Tenant) -> None:
    holder = states.runner(tenant.organization)
    claimed = states.runner_job(tenant.organization, holder)
    pending = states.runner_job(tenant.organization)

    assert ids(jobs(tenant, run=str(claimed.run_id))) == {str(claimed.pk)}
    assert ids(jobs(tenant, step=pending.step_id)) == {str(pending.pk)}
    assert ids(jobs(tenant, status="pending")) == {str(pending.pk)}
    assert ids(jobs(tenant, status=["pending", "claimed"])) == {str(pending.pk), str(claimed.pk)}
    assert ids(jobs(tenant, runner_id=holder.pk)) == {str(claimed.pk)}
    assert jobs(tenant, runner_id="no-such-runner") == []


def test_a_job_found_in_the_list_can_be_stopped(tenant: Tenant) -> None:
    holder = states.runner(tenant.organization)
    job = states.runner_job(tenant.organization, holder)
    step = steps_of(tenant, job.run_id)["agent"]

    (found,) = jobs(tenant, step=step["id"], status="claimed")
    response = tenant.post(f"/api/v1/runner-jobs/{found['id']}/stop")

    assert response.status_code == 200, response.content
    assert response.json()["status"] == "stopping"
    assert RunnerJob.objects.get(pk=job.pk).status == "stopping"


def test_the_job_list_shows_nothing_of_another_organization(
    tenant: Tenant, other_tenant: Tenant
) -> None:
    theirs = states.runner_job(tenant.organization)

    assert jobs(other_tenant) == []
    assert jobs(other_tenant, run=str(theirs.run_id)) == []
    assert jobs(other_tenant, step=theirs.step_id) == []


@pytest.mark.parametrize(
    ("params", "path"),
    [
        ({"run": "not-a-uuid"}, "run"),
        ({"step": "0"}, "step"),
        ({"status": "asleep"}, "status"),
        ({"runner_id": "x" * 41}, "runner_id"),
        ({"runner": "r"}, "runner"),
    ],
)
def test_bad_job_filters_are_refused_by_name(
    tenant: Tenant, params: dict[str, str], path: str
) -> None:
    response = tenant.get("/api/v1/runner-jobs", params)

    assert response.status_code == 400
    body = response.json()
    assert body["code"] == "invalid_request"
    assert [detail["path"] for detail in body["details"]] == [path]


def test_a_retried_runner_step_names_its_latest_attempts_job(tenant: Tenant) -> None:
    job = states.runner_job(tenant.organization)
    # A retry's attempt gets a job of its own (runnerjob_one_per_attempt); the step
    # names the latest, the list has both.
    later = RunnerJob.objects.create(
        organization=tenant.organization,
        run_id=job.run_id,
        step_id=job.step_id,
        attempt=job.attempt + 1,
        prompt=job.prompt,
        session_id=job.session_id,
        timeout_at=job.timeout_at,
    )

    assert steps_of(tenant, job.run_id)["agent"]["job"] == str(later.pk)
    assert ids(jobs(tenant, step=job.step_id)) == {str(job.pk), str(later.pk)}


# --------------------------------------------------------------------------- exclude
def test_exclude_leaves_the_plan_and_the_outputs_out_of_a_run(tenant: Tenant) -> None:
    run = states.running(tenant.organization)
    path = f"/api/v1/runs/{run.pk}"
    whole = tenant.get(path).json()

    status_only = tenant.get(path, {"exclude": "outputs,plan"}).json()
    repeated = tenant.get(path + "?exclude=outputs&exclude=plan").json()
    no_plan = tenant.get(path, {"exclude": "plan"}).json()

    assert {"plan", "outputs", "outputs_truncated"} <= set(whole)
    assert set(whole) - set(status_only) == {"plan", "outputs", "outputs_truncated"}
    assert status_only == repeated
    assert set(whole) - set(no_plan) == {"plan"}
    assert status_only["progress"] == whole["progress"]
    assert status_only["status"] == whole["status"]


@pytest.mark.parametrize("value", ["", "outputs,", "steps", "outputs,credits"])
def test_exclude_refuses_what_it_cannot_leave_out(tenant: Tenant, value: str) -> None:
    run = states.running(tenant.organization)

    response = tenant.get(f"/api/v1/runs/{run.pk}", {"exclude": value})

    assert response.status_code == 400
    body = response.json()
    assert body["code"] == "invalid_request"
    assert [detail["path"] for detail in body["details"]] == ["exclude"]


def test_a_status_poll_of_a_20000_step_run_stays_under_5_kb(tenant: Tenant) -> None:
    spec = factories.plan(name="wide", tasks=4, steps=5000)
    run = states.running_plan(tenant.organization, spec)
    # Every step completed with a small output: the outputs a whole read carries.
    Step.objects.filter(run=run).update(status="completed", output={"ok": True})
    path = f"/api/v1/runs/{run.pk}"

    whole = tenant.get(path)
    status_only = tenant.get(path, {"exclude": "outputs,plan"})

    assert status_only.status_code == 200
    assert status_only.json()["progress"]["steps_total"] == 20_000
    assert len(whole.content) > 500_000
    assert len(status_only.content) < 5_000, len(status_only.content)
