"""``orch jobs`` and what ``orch runs show`` says of a step's work elsewhere, and the
client's status polls (``exclude``), against a live server."""

from __future__ import annotations

import pytest

from orchestrator.lease_keeper import renew
from orchestrator_client import Client
from orchestrator_client.types import STATUS_ONLY
from runs.models import RunnerJob, Step
from runs.transitions import claim_step
from tests.api import states
from tests.client.conftest import Orch
from tests.tenants import LiveTenant

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def test_jobs_are_listed_filtered_shown_and_stopped(orch: Orch, tenant: LiveTenant) -> None:
    holder = states.runner(tenant.organization)
    claimed = states.runner_job(tenant.organization, holder)
    pending = states.runner_job(tenant.organization)

    listed = orch.json("jobs", "ls")
    assert [job["id"] for job in listed] == [str(pending.pk), str(claimed.pk)]
    assert [job["id"] for job in orch.json("jobs", "ls", "--status", "claimed")] == [
        str(claimed.pk)
    ]
    assert [job["id"] for job in orch.json("jobs", "ls", "--run", str(pending.run_id))] == [
        str(pending.pk)
    ]
    assert [job["id"] for job in orch.json("jobs", "ls", "--runner", holder.pk)] == [
        str(claimed.pk)
    ]
    table = orch.run("jobs", "ls")
    assert table.returncode == 0, table.stderr
    assert str(claimed.pk) in table.stdout
    assert "pending" in table.stdout

    shown = orch.run("jobs", "show", str(claimed.pk))
    assert shown.returncode == 0, shown.stderr
    assert "status    claimed" in shown.stdout
    assert f"runner    {holder.pk}" in shown.stdout

    stopped = orch.json("jobs", "stop", str(claimed.pk))
    assert stopped["status"] == "stopping"
    assert RunnerJob.objects.get(pk=claimed.pk).status == "stopping"

    # A pending job cannot be stopped: the API's 409, exit 1, nothing changed.
    refused = orch.run("jobs", "stop", str(pending.pk))
    assert refused.returncode == 1
    assert "invalid_transition" in refused.stderr
    assert RunnerJob.objects.get(pk=pending.pk).status == "pending"


def test_runs_show_names_each_steps_job_and_child_run(orch: Orch, tenant: LiveTenant) -> None:
    job = states.runner_job(tenant.organization)
    step, child = states.child_step(tenant.organization)

    with_job = orch.run("runs", "show", str(job.run_id))
    with_child = orch.run("runs", "show", str(step.run_id))

    assert with_job.returncode == 0, with_job.stderr
    assert f"job {job.pk}" in with_job.stdout
    assert with_child.returncode == 0, with_child.stderr
    assert f"child run {child.pk}" in with_child.stdout


def test_status_polls_leave_the_plan_and_the_outputs_out(
    client: Client, tenant: LiveTenant
) -> None:
    run = states.running(tenant.organization)

    whole = client.get_run(str(run.pk))
    status_only = client.get_run(str(run.pk), exclude=STATUS_ONLY)
    (update,) = [next(iter(client.watch(str(run.pk))))]

    assert "plan" in whole
    assert "outputs" in whole
    assert "plan" not in status_only
    assert "outputs" not in status_only
    assert "plan" not in update.run
    assert "outputs" not in update.run
    assert status_only["progress"] == whole["progress"]


def test_runs_show_says_how_far_a_running_steps_tool_got(orch: Orch, tenant: LiveTenant) -> None:
    run = states.running(tenant.organization)
    step = Step.objects.filter(run=run).order_by("id").first()
    assert step is not None
    assert claim_step(step.pk, worker="test", task_id="test", lease_seconds=60) is not None
    renew(step.pk, run.pk, 1, progress={"of": 9, "sentence": 3})

    shown = orch.run("runs", "show", str(run.pk))

    assert shown.returncode == 0, shown.stderr
    path = f"{step.task.agent.name}.{step.task.name}.{step.name}"
    assert f'progress  {path} (step {step.pk}, noop): {{"of": 9, "sentence": 3}}' in shown.stdout
