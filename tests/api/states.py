"""Runs of one organization brought to a given state through the real services and engine
(no worker: messages are not published, the rows say what a worker would do next)."""

from __future__ import annotations

from collections.abc import Callable

from billing.models import Organization
from runs import services
from runs.engine import control
from runs.models import Run
from tests import factories


def created(organization: Organization) -> Run:
    return factories.run(organization)


def pending(organization: Organization) -> Run:
    run = created(organization)
    return services.run_start(run_id=run.pk)


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
    services.run_start(run_id=run.pk)
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
