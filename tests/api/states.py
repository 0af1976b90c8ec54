"""Runs of one organization brought to a given state through the real services and engine
(no worker: messages are not published, the rows say what a worker would do next)."""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

from artifacts import services as artifact_services
from artifacts.models import Artifact
from billing.models import Organization
from orchestrator.tools.asynchronous import child_run as run_tool
from orchestrator.tools.builtin import runner as runner_tool
from runs import catalogue, services
from runs.engine import control
from runs.engine.outcomes import Outcome, record
from runs.engine.start import run_start
from runs.models import EscalationTicket, Run, Runner, RunnerJob, Step
from runs.people import escalations
from runs.transitions import claim_step
from runs.waits import callbacks, runners
from schedules import services as schedule_services
from schedules.models import Schedule
from tests import factories
from webhooks import services as webhook_services
from webhooks.models import WebhookDelivery, WebhookEndpoint


def created(organization: Organization) -> Run:
    return factories.run(organization)


def pending(organization: Organization) -> Run:
    run = created(organization)
    return run_start(run_id=run.pk)


def running(organization: Organization) -> Run:
    """Picked up: agents, tasks and steps materialised, the first steps dispatched."""
    run = pending(organization)
    control.pick_up(run.pk)
    return Run.objects.get(pk=run.pk)


def paused(organization: Organization) -> Run:
    return services.run_pause(run_id=running(organization).pk)


def failed(organization: Organization) -> Run:
    return services.run_fail(run_id=running(organization).pk, code="tool_error", message="boom")


def waiting_approval(organization: Organization) -> Run:
    spec = factories.plan(name="needs-a-person")
    spec["agents"][0]["tasks"][0]["steps"] = [factories.step("sign-off", "approval")]
    run = services.run_create(organization=organization, plan=spec)
    run_start(run_id=run.pk)
    control.pick_up(run.pk)
    run = Run.objects.get(pk=run.pk)
    assert run.status == "waiting_approval", run.status
    return run


# The state each control action needs in order to succeed.
READY_FOR: dict[str, Callable[[Organization], Run]] = {
    "run-start": created,
    "run-cancel": running,
    "run-pause": running,
    "run-resume": paused,
    "run-retry": failed,
    "run-approve": waiting_approval,
    "run-reject": waiting_approval,
}


# --------------------------------------------------------------------------- reuse
REUSE_ROUTES = frozenset({"run-fork", "cache-invalidate"})


def reuse_request(name: str, organization: Organization) -> tuple[dict[str, Any], dict[str, Any]]:
    """(path values, JSON body) of a fork or a cache invalidation that succeeds for
    ``organization``: a fork of a failed run from its first step (not started)."""
    if name == "run-fork":
        run = failed(organization)
        return {"run_id": run.pk}, {"from": "agent-0.task-0.step-0", "start": False}
    return {}, {"key": "price:chips"}


# --------------------------------------------------------------------------- runners
def runner(organization: Organization, hostname: str = "host-a") -> Runner:
    return runners.register(
        organization=organization,
        hostname=hostname,
        project_dir="/srv/project",
        executor_type="claude-code",
        tags=["gpu"],
    ).runner


def runner_job(organization: Organization, holder: Runner | None = None) -> RunnerJob:
    """A `runner` step parked on its job (pending), claimed by ``holder`` when given."""
    spec = factories.plan(name="on-a-runner")
    params = {"prompt": "write the report"}
    spec["agents"][0]["tasks"][0]["steps"] = [factories.step("agent", "runner", params=params)]
    run = running_plan(organization, spec)
    step = Step.objects.get(run=run, name="agent")
    claimed = claim_step(step.pk, worker="test", task_id="test", lease_seconds=60)
    assert claimed is not None
    wait = runner_tool(params, None).wait  # type: ignore[arg-type]
    record(step.pk, run.pk, claimed["attempts"], Outcome(wait=wait))
    job = RunnerJob.objects.get(step=step)
    if holder is not None:
        polled = runners.poll(organization=organization, runner_id=holder.pk)
        assert polled.job is not None
        assert polled.job.pk == job.pk
        job.refresh_from_db()
    return job


def child_step(organization: Organization) -> tuple[Step, Run]:
    """A sync `run` step waiting for the child run it started: the step and the child."""
    spec = factories.plan(name="parent")
    params = {"plan": factories.plan(name="child"), "execution_mode": "sync"}
    spec["agents"][0]["tasks"][0]["steps"] = [factories.step("delegate", "run", params=params)]
    run = running_plan(organization, spec)
    step = Step.objects.get(run=run, name="delegate")
    claimed = claim_step(step.pk, worker="test", task_id="test", lease_seconds=60)
    assert claimed is not None
    wait = run_tool(params, None).wait  # type: ignore[arg-type]
    record(step.pk, run.pk, claimed["attempts"], Outcome(wait=wait))
    step.refresh_from_db()
    return step, Run.objects.get(parent_step=step)


# --------------------------------------------------------------------------- callbacks
CALLBACK_ROUTES = frozenset({"run-callback"})


def callback_request(organization: Organization) -> tuple[dict[str, Any], dict[str, Any]]:
    """(path values, body) that end a `callback` step parked on its callback, by its id."""
    spec = factories.plan(name="calls-back")
    hook = factories.step("hook", "callback", params={"timeout": 60})
    spec["agents"][0]["tasks"][0]["steps"] = [hook]
    run = running_plan(organization, spec)
    step = Step.objects.get(run=run, name="hook")
    claimed = claim_step(step.pk, worker="test", task_id="test", lease_seconds=60)
    assert claimed is not None
    opened = callbacks.open_callback(
        callbacks.new_callback(), step_id=step.pk, attempt=claimed["attempts"], expires_in=60
    )
    record(step.pk, run.pk, claimed["attempts"], Outcome(wait={"kind": "callback", **opened}))
    return {"run_id": run.pk}, {"callback": opened["wait"], "status": "completed", "result": 1}


def running_plan(organization: Organization, spec: dict[str, Any]) -> Run:
    run = services.run_create(organization=organization, plan=spec)
    run_start(run_id=run.pk)
    control.pick_up(run.pk)
    return Run.objects.get(pk=run.pk)


RUNNER_ROUTES = frozenset(
    {
        "runner-register",
        "runner-poll",
        "runner-heartbeat",
        "runner-deregister",
        "job-started",
        "job-completed",
        "job-failed",
        "job-stopped",
        "runner-reports",
        "runner-job",
        "runner-job-stop",
    }
)


def runner_request(name: str, organization: Organization) -> tuple[dict[str, Any], dict[str, Any]]:
    """(path values, body) of a runner or runner-job route that succeeds for
    ``organization``; the body is the query of a GET."""
    if name == "runner-register":
        body = {"hostname": "host-z", "project_dir": "/z", "executor_type": "claude-code"}
        return {}, body
    holder = runner(organization)
    if name in ("runner-poll", "runner-heartbeat", "runner-deregister"):
        return {}, {"runner_id": holder.pk, **({"wait": 0} if name == "runner-poll" else {})}
    job = runner_job(organization, holder)
    if name == "runner-reports":
        report = {"job": str(job.pk), "kind": "completed", "result": {"pages": 3}}
        return {}, {"runner_id": holder.pk, "reports": [report]}
    bodies: dict[str, dict[str, Any]] = {
        "job-started": {"runner_id": holder.pk},
        "job-completed": {"runner_id": holder.pk, "result": {"pages": 3}},
        "job-failed": {"runner_id": holder.pk, "error": "the agent crashed"},
        "job-stopped": {"runner_id": holder.pk, "signal": "SIGTERM"},
        "runner-job": {},
        "runner-job-stop": {},
    }
    return {"job_id": job.pk}, bodies[name]


# --------------------------------------------------------------------------- artifacts
ARTIFACT_ROUTES = frozenset(
    {
        "run-artifacts",
        "run-artifact-uploads",
        "artifact",
        "artifact-complete",
        "artifact-content",
        "artifact-download",
    }
)


def artifact(organization: Organization, *, uploading: bool = False) -> Artifact:
    """An artifact of a running run: available, or a presigned upload whose bytes are in
    and that only needs completing."""
    run = running(organization)
    if not uploading:
        return artifact_services.upload(
            organization=organization,
            run_id=run.pk,
            name="report.txt",
            stream=io.BytesIO(b"abc"),
            size=3,
            content_type="text/plain",
        )
    started = artifact_services.start_upload(
        organization=organization, run_id=run.pk, name="pending.bin", size=3
    )
    artifact_services.receive_content(
        organization=organization, artifact_id=started.artifact.pk, stream=io.BytesIO(b"abc")
    )
    return started.artifact


def artifact_request(
    name: str, organization: Organization
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(path values, JSON body) of an artifact route that succeeds for ``organization``."""
    if name in ("run-artifacts", "run-artifact-uploads"):
        body = {"name": "big.bin", "size": 3} if name == "run-artifact-uploads" else {}
        return {"run_id": running(organization).pk}, body
    if name == "artifact-complete":
        return {"artifact_id": artifact(organization, uploading=True).pk}, {}
    return {"artifact_id": artifact(organization).pk}, {}


# --------------------------------------------------------------------------- escalations
ESCALATION_ROUTES = frozenset({"escalation", "escalation-acknowledge", "escalation-resolve"})


def escalation(organization: Organization) -> EscalationTicket:
    """An open ticket: a running run an operator escalated."""
    run = running(organization)
    return escalations.escalation_open(run_id=run.pk, actor="test", note="have a look")


def escalation_request(
    name: str, organization: Organization
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(path values, JSON body) of an escalation route that succeeds for ``organization``."""
    body = {"action": "resume"} if name == "escalation-resolve" else {}
    return {"escalation_id": escalation(organization).pk}, body


# --------------------------------------------------------------------------- schedules
SCHEDULE_ROUTES = frozenset(
    {
        "schedules",
        "schedule",
        "schedule-pause",
        "schedule-resume",
        "schedule-trigger",
        "schedule-fires",
    }
)


def schedule_body() -> dict[str, Any]:
    """A schedule's body that creates one: every hour, a one-step plan."""
    return {"name": "hourly", "plan": factories.plan(name="scheduled", steps=1), "interval": "1h"}


def schedule(organization: Organization) -> Schedule:
    """An active schedule of the organization, every hour."""
    return schedule_services.schedule_create(organization=organization, **schedule_body())


def schedule_request(
    name: str, organization: Organization
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(path values, JSON body) of a schedule route that succeeds for ``organization``."""
    if name == "schedules":
        return {}, schedule_body()
    created = schedule(organization)
    if name == "schedule-resume":
        schedule_services.schedule_pause(schedule_id=created.pk)
    return {"schedule_id": created.pk}, {}


# --------------------------------------------------------------------------- webhooks
WEBHOOK_ROUTES = frozenset({"webhooks", "webhook-test", "webhook-redeliver"})


def webhook_body() -> dict[str, Any]:
    return {"url": "https://hooks.example.com/orchestrator", "events": ["run.completed"]}


def webhook(organization: Organization) -> WebhookEndpoint:
    """An endpoint of the organization for completed runs (never reached: no worker)."""
    return webhook_services.endpoint_create(organization=organization, **webhook_body())[0]


def webhook_delivery(organization: Organization) -> WebhookDelivery:
    """A test delivery to a new endpoint of the organization."""
    return webhook_services.endpoint_test(endpoint_id=webhook(organization).pk)


def webhook_request(name: str, organization: Organization) -> tuple[dict[str, Any], dict[str, Any]]:
    """(path values, JSON body) of a webhook POST route that succeeds for ``organization``."""
    if name == "webhooks":
        return {}, webhook_body()
    delivery = webhook_delivery(organization)
    return {"webhook_id": delivery.endpoint_id, "delivery_id": delivery.uid}, {}


# --------------------------------------------------------------------------- published tools
# A tool version as a worker (or, organization None, the fleet) publishes it.
SCHEMA = {
    "type": "object",
    "properties": {"text": {"type": "string"}, "top": {"type": "integer", "default": 3}},
    "required": ["text"],
    "additionalProperties": False,
}


def publish_tool(organization: Any, name: str, version: str = "1", by: str = "worker-1") -> None:
    definition = catalogue.definition_from(
        {
            "name": name,
            "version": version,
            "description": f"{name}, version {version}",
            "params_schema": SCHEMA,
            "output_schema": {"type": "object"},
            "cost": {"credits": "0.01"},
        }
    )
    catalogue.publish(organization=organization, definitions=[definition], by=by)
