"""`make profile-api`'s data and its floor: an organization with an API key, a secret
and runs in several states (created, running, completed with outputs), made through the
services as clients and workers would; fresh runs for the routes that change one; and
the trivial authenticated view that measures what every request pays before its own
work."""

from __future__ import annotations

import types
import uuid
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

FLOOR_PATH = "/api/v1/_profile/floor"

# A run's plan as a client sends it: two tasks of three steps, variables and a template.
PLAN: dict[str, Any] = {
    "name": "profile-api",
    "variables": {"topic": "AI chips"},
    "agents": [
        {
            "name": "researcher",
            "tasks": [
                {
                    "name": name,
                    "steps": [
                        {"name": "search", "tool": "echo", "params": {"q": "${variables.topic}"}},
                        {"name": "read", "tool": "echo", "params": {"n": 3}},
                        {"name": "summarise", "tool": "noop"},
                    ],
                }
                for name in ("gather", "write")
            ],
        }
    ],
}
DETAIL_STEPS = 20  # the completed run read by run, steps and events: 20 steps with outputs


def urlconf() -> types.ModuleType:
    """The project's URLs, and before them a trivial authenticated view: an ``ApiView``
    (authentication, permissions, throttling, log context, query check) answering a
    constant. Only this profiler mounts it, never the public API."""
    from django.urls import path
    from rest_framework.request import Request
    from rest_framework.response import Response

    from api.base import ApiView
    from config import urls

    class FloorApi(ApiView):
        def get(self, request: Request) -> Response:
            return Response({"ok": True})

    module = types.ModuleType("bench.profile_api.urls")
    module.urlpatterns = [  # type: ignore[attr-defined]
        path(FLOOR_PATH.lstrip("/"), FloorApi.as_view(), name="profile-floor"),
        *urls.urlpatterns,
    ]
    module.handler404 = urls.handler404  # type: ignore[attr-defined]
    module.handler500 = urls.handler500  # type: ignore[attr-defined]
    return module


# --------------------------------------------------------------------------- the data
@dataclass
class Fixture:
    organization: Any
    key: str
    detail_run: str  # completed, DETAIL_STEPS steps with outputs
    counts: dict[str, int] = field(default_factory=dict)


def _start(run_id: Any) -> None:
    """Started and running, as a worker's pick-up leaves it (at once when the start
    began it in its own transaction)."""
    from runs.engine import control
    from runs.engine.start import run_start
    from runs.models import Run

    run_start(run_id=run_id)
    if Run.objects.values_list("status", flat=True).get(pk=run_id) == "pending":
        control.pick_up(run_id)


def _complete(run_id: Any, price: Decimal) -> None:
    """Every step claimed and recorded with an output, in order, as a worker would."""
    from runs.engine.outcomes import Outcome, record
    from runs.models import Run, Step
    from runs.transitions import claim_step

    steps = Step.objects.filter(run_id=run_id).order_by("task__position", "position")
    for step_id, name in steps.values_list("pk", "name"):
        claimed = claim_step(step_id, worker="profile", task_id="profile", lease_seconds=60)
        if claimed is None:
            raise RuntimeError(f"step {step_id} of run {run_id} could not be claimed")
        output = {"step": name, "text": f"the output of {name}, " * 8, "n": step_id}
        record(step_id, run_id, claimed["attempts"], Outcome(output=output, cost=price))
    if Run.objects.values_list("status", flat=True).get(pk=run_id) != "completed":
        raise RuntimeError(f"run {run_id} did not complete")


def _sequence(name: str, steps: int) -> dict[str, Any]:
    """One task of ``steps`` sequential echo steps."""
    tasks = [
        {
            "name": "t",
            "steps": [{"name": f"s{i}", "tool": "echo", "params": {"i": i}} for i in range(steps)],
        }
    ]
    return {"name": name, "agents": [{"name": "a", "tasks": tasks}]}


def fixture(*, running: int = 60, completed: int = 10, created: int = 20) -> Fixture:
    """An organization, its key and a secret, runs in several states: ``running``
    running, ``completed`` small ones completed, ``created`` created, and the detail run."""
    from billing.models import Organization
    from billing.pricing import tool_price
    from billing.secrets import secret_put
    from billing.services import api_key_create, credits_grant, organization_create
    from runs import services

    organization = organization_create(name=f"profile-api-{uuid.uuid4().hex[:8]}")
    credits_grant(organization=organization, amount=Decimal(10_000_000), reason="profile-api")
    # Every start admitted at once, however many runs the profile leaves running.
    Organization.objects.filter(pk=organization.pk).update(
        max_running_runs=1_000_000, max_pending_runs=1_000_000, max_running_steps=1_000_000
    )
    organization.refresh_from_db()
    _, key = api_key_create(organization=organization, name="profile-api")
    secret_put(organization=organization, name="PROFILE_TOKEN", value="s3cr3t-value")
    price = tool_price("echo")

    def create(plan: dict[str, Any]) -> Any:
        return services.run_create(organization=organization, plan=plan, actor="profile").pk

    detail = create(_sequence("profile-detail", DETAIL_STEPS))
    _start(detail)
    _complete(detail, price)
    for index in range(completed):
        run_id = create(_sequence(f"profile-done-{index}", 3))
        _start(run_id)
        _complete(run_id, price)
    for _ in range(running):
        _start(create(PLAN))
    for _ in range(created):
        create(PLAN)
    counts = {"running": running, "completed": completed + 1, "created": created}
    return Fixture(organization, key, str(detail), counts)


def fresh_runs(fixture: Fixture, state: str, count: int) -> list[str]:
    """``count`` runs of PLAN, created (or started, for "running") for routes that
    change a run: each request acts on a run of its own."""
    from runs import services

    ids = []
    for _ in range(count):
        run_id = services.run_create(
            organization=fixture.organization, plan=PLAN, actor="profile"
        ).pk
        if state == "running":
            _start(run_id)
        ids.append(str(run_id))
    return ids
