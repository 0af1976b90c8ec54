"""Several reports of one runner in one request (`POST /runner/reports`,
runs.waits.runners.report_many): each applied as its single route would, each refused alone."""

from __future__ import annotations

from typing import Any

import pytest

from billing.models import LedgerEntry, Reservation
from billing.pricing import tool_price
from orchestrator.tools.packages import remote
from runs.engine.outcomes import Outcome, record
from runs.models import Run, RunEvent, RunnerJob, Step
from runs.transitions import claim_step
from tests import factories
from tests.api import states
from tests.api.test_runner_tools import poll, tool_job, worker
from tests.tenants import Tenant

pytestmark = pytest.mark.django_db

REPORTS = "/api/v1/runner/reports"


def parked_jobs(tenant: Tenant, count: int) -> list[RunnerJob]:
    """``count`` parallel steps of one run, each parked on its worker tool's job."""
    spec = factories.plan(name="worker-tools")
    # A failure ends its own step only: the others' jobs stay as their reports leave them.
    spec["agents"][0]["tasks"][0] |= {"mode": "parallel", "failure_mode": "continue"}
    spec["agents"][0]["tasks"][0]["steps"] = [
        {"name": f"s{n}", "tool": "acme.summarize", "params": {"text": str(n)}}
        for n in range(count)
    ]
    run = states.running_plan(tenant.organization, spec)
    for step in Step.objects.filter(run=run).order_by("name"):
        claimed = claim_step(step.pk, worker="test", task_id="test", lease_seconds=60)
        assert claimed is not None
        wait = remote("acme.summarize").run(dict(step.params), None)  # type: ignore[arg-type,misc]
        record(step.pk, run.pk, claimed["attempts"], Outcome(wait=wait.wait))
    return list(RunnerJob.objects.filter(run=run).order_by("step__name"))


def send(tenant: Tenant, runner_id: str, *reports: dict[str, Any], key: str = "") -> Any:
    headers = {"Idempotency-Key": key} if key else {}
    return tenant.client.post(
        REPORTS, {"runner_id": runner_id, "reports": list(reports)}, format="json", headers=headers
    )


def completed(job: RunnerJob, result: Any) -> dict[str, Any]:
    return {"job": str(job.pk), "kind": "completed", "result": result}


def test_one_request_ends_several_jobs_each_as_its_own_report_would(tenant: Tenant) -> None:
    runner_id = worker(tenant, "host-a")
    jobs = parked_jobs(tenant, 3)
    other = tool_job(tenant, {"text": "another run"})
    assert len(poll(tenant, runner_id, max_jobs=4).json()["jobs"]) == 4

    response = send(
        tenant,
        runner_id,
        completed(jobs[0], {"n": 0}),
        completed(other, {"n": "other"}),
        {"job": str(jobs[1].pk), "kind": "failed", "error": "no", "code": "not_found"},
        {"job": str(jobs[2].pk), "kind": "started"},
    )

    assert response.status_code == 200, response.json()
    assert response.json()["results"] == [
        {"job": str(job.pk), "ok": True} for job in (jobs[0], other, jobs[1], jobs[2])
    ]
    statuses = {job.pk: job.status for job in RunnerJob.objects.all()}
    assert [statuses[job.pk] for job in (*jobs, other)] == [
        "completed",
        "failed",
        "running",
        "completed",
    ]
    assert Step.objects.get(pk=jobs[0].step_id).output == {"n": 0}
    assert (Step.objects.get(pk=jobs[1].step_id).error or {})["code"] == "not_found"
    assert Step.objects.get(pk=jobs[2].step_id).status == "running"
    # Each job's history says what its single report would have said.
    reported = RunEvent.objects.filter(message__contains=f"reported by runner {runner_id}")
    assert sorted(event.payload["status"] for event in reported) == [
        "completed",
        "completed",
        "failed",
        "running",
    ]


def test_a_report_on_a_job_the_runner_does_not_hold_is_refused_alone(tenant: Tenant) -> None:
    holder = worker(tenant, "host-a")
    jobs = parked_jobs(tenant, 2)
    poll(tenant, holder, max_jobs=2)
    intruder = worker(tenant, "host-b")
    mine = parked_jobs(tenant, 1)[0]
    poll(tenant, intruder, max_jobs=1)
    unknown = "00000000-0000-4000-8000-000000000000"

    response = send(
        tenant,
        intruder,
        completed(jobs[0], "stolen"),
        completed(mine, "mine"),
        {"job": unknown, "kind": "completed"},
    )

    assert response.status_code == 200, response.json()
    results = response.json()["results"]
    assert [(r["job"], r["ok"], r.get("refused", {}).get("code")) for r in results] == [
        (str(jobs[0].pk), False, "not_job_owner"),
        (str(mine.pk), True, None),
        (unknown, False, "not_found"),
    ]
    assert RunnerJob.objects.get(pk=jobs[0].pk).status == "claimed"
    assert Step.objects.get(pk=jobs[0].step_id).status == "running"
    assert RunnerJob.objects.get(pk=mine.pk).status == "completed"


def test_a_report_the_jobs_state_does_not_allow_is_refused_alone(tenant: Tenant) -> None:
    runner_id = worker(tenant, "host-a")
    jobs = parked_jobs(tenant, 2)
    poll(tenant, runner_id, max_jobs=2)
    send(tenant, runner_id, completed(jobs[0], 1))

    response = send(
        tenant,
        runner_id,
        {"job": str(jobs[0].pk), "kind": "failed", "error": "too late"},
        completed(jobs[1], 2),
    )

    results = response.json()["results"]
    assert [(r["ok"], r.get("refused", {}).get("code")) for r in results] == [
        (False, "invalid_transition"),
        (True, None),
    ]
    assert RunnerJob.objects.get(pk=jobs[0].pk).status == "completed"


def test_a_batch_sent_again_changes_nothing_and_charges_once(tenant: Tenant) -> None:
    runner_id = worker(tenant, "host-a")
    jobs = parked_jobs(tenant, 2)
    poll(tenant, runner_id, max_jobs=2)
    batch = [completed(jobs[0], {"a": 1}), completed(jobs[1], {"b": 2})]

    first = send(tenant, runner_id, *batch, key="batch-1")
    charged = Reservation.objects.get(run_id=jobs[0].run_id).charged
    entries = LedgerEntry.objects.count()
    replayed = send(tenant, runner_id, *batch, key="batch-1")
    repeated = send(tenant, runner_id, *batch, key="batch-2")

    assert first.status_code == replayed.status_code == repeated.status_code == 200
    assert replayed.headers["Idempotent-Replayed"] == "true"
    assert first.json() == replayed.json() == repeated.json()
    assert charged == tool_price("acme.summarize") * 2  # once each
    assert Reservation.objects.get(run_id=jobs[0].run_id).charged == charged
    assert LedgerEntry.objects.count() == entries
    assert Run.objects.get(pk=jobs[0].run_id).status == "completed"


@pytest.mark.parametrize(
    ("report", "path"),
    [
        ({"kind": "failed"}, "reports[0].error"),
        ({"kind": "stopped", "signal": "SIGHUP"}, "reports[0].signal"),
        ({"kind": "started", "result": 1}, "reports[0].result"),
        ({"kind": "completed", "signal": "SIGTERM"}, "reports[0].signal"),
        ({"kind": "finished"}, "reports[0].kind"),
    ],
)
def test_a_report_that_its_kind_does_not_take_refuses_the_batch(
    tenant: Tenant, report: dict[str, Any], path: str
) -> None:
    runner_id = worker(tenant, "host-a")
    job = parked_jobs(tenant, 1)[0]
    poll(tenant, runner_id, max_jobs=1)

    response = send(tenant, runner_id, {"job": str(job.pk), **report})

    assert response.status_code == 400, response.json()
    assert [problem["path"] for problem in response.json()["details"]] == [path]
    assert RunnerJob.objects.get(pk=job.pk).status == "claimed"


def test_a_job_reported_twice_in_one_batch_refuses_it(tenant: Tenant) -> None:
    runner_id = worker(tenant, "host-a")
    job = parked_jobs(tenant, 1)[0]
    poll(tenant, runner_id, max_jobs=1)

    response = send(
        tenant, runner_id, {"job": str(job.pk), "kind": "started"}, completed(job, None)
    )

    assert response.status_code == 400
    assert response.json()["details"][0]["path"] == "reports"
    assert RunnerJob.objects.get(pk=job.pk).status == "claimed"


def test_another_organizations_job_is_not_found_in_a_batch(
    tenant: Tenant, other_tenant: Tenant
) -> None:
    theirs = states.runner_job(tenant.organization, states.runner(tenant.organization))
    own = states.runner(other_tenant.organization)

    response = send(other_tenant, own.pk, completed(theirs, "not yours"))

    assert response.status_code == 200
    assert response.json()["results"][0]["refused"]["code"] == "not_found"
    theirs.refresh_from_db()
    assert theirs.status == "claimed"
