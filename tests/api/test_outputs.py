"""The API's runs, steps and events are read by statements written once
(runs/queries/*.sql) and written by plain functions (api.serializers.FastOutput). These
tests hold each answer equal to what the ORM's rows and DRF's general path make of the
same runs, for runs in every state: a reference written here, the way the API answered
before (the ORM's querysets, DRF's ``Serializer.to_representation`` field by field)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from django.db.models import Count, Sum
from django.db.models.functions import Coalesce
from django.utils import timezone
from rest_framework import serializers
from rest_framework.fields import SkipField
from rest_framework.renderers import JSONRenderer

from api.serializers import (
    ChildRunOutput,
    EventOutput,
    RunOutput,
    StepOutput,
)
from billing.models import Organization, Reservation
from runs import services
from runs.engine.outcomes import Outcome, record
from runs.models import Agent, HistoryEvent, Run, Step, Task
from runs.selectors import OUTPUTS_INLINE, run_history
from runs.states import STEP_TERMINAL
from runs.transitions import claim_step
from tests import factories
from tests.api import states
from tests.tenants import Tenant

pytestmark = pytest.mark.django_db


# --------------------------------------------------------------------------- runs
def completed(organization: Organization, steps: int = 2) -> Run:
    """Every step claimed and recorded, as a worker would, each with an output (text,
    numbers, nesting) and a cost: the run completed, its credits charged and settled."""
    spec = factories.plan(name="with-outputs", agents=2, tasks=2, steps=steps, tool="echo")
    run = states.running_plan(organization, spec)
    while True:
        ready = Step.objects.filter(run=run, status="pending", dispatched_at__isnull=False)
        step = ready.order_by("pk").first()
        if step is None:
            break
        claimed = claim_step(step.pk, worker="test", task_id="test", lease_seconds=60)
        assert claimed is not None
        output = {"said": f"héllo from {step.name}", "n": step.pk, "x": 0.1, "deep": [{"a": None}]}
        record(step.pk, run.pk, claimed["attempts"], Outcome(output=output, cost=Decimal("0.0125")))
    run.refresh_from_db()
    assert run.status == "completed", run.status
    return run


def cancelled(organization: Organization) -> Run:
    return services.run_cancel(run_id=states.running(organization).pk, reason="enough")


def parent(organization: Organization) -> Run:
    step, _ = states.child_step(organization)
    return step.run


def on_a_runner(organization: Organization) -> Run:
    return states.runner_job(organization).run


STATES = {
    "created": states.created,
    "pending": states.pending,
    "running": states.running,
    "paused": states.paused,
    "failed": states.failed,
    "waiting_approval": states.waiting_approval,
    "completed": completed,
    "cancelled": cancelled,
    "parent": parent,
    "on_a_runner": on_a_runner,
}


@pytest.fixture(params=sorted(STATES))
def run(request: pytest.FixtureRequest, tenant: Tenant) -> Run:
    return STATES[request.param](tenant.organization)


# --------------------------------------------------------------------------- reference
def general(serializer: serializers.Serializer[Any], instance: Any) -> dict[str, Any]:
    """DRF's ``Serializer.to_representation``, nested serializers included: every field's
    attribute through ``get_attribute``, then its ``to_representation``."""
    data: dict[str, Any] = {}
    for field in serializer._readable_fields:
        try:
            value = field.get_attribute(instance)
        except SkipField:
            continue
        if value is None:
            data[str(field.field_name)] = None
        elif isinstance(field, serializers.Serializer):
            data[str(field.field_name)] = general(field, value)
        else:
            data[str(field.field_name)] = field.to_representation(value)
    return data


def rendered(data: Any) -> Any:
    """``data`` as the client reads it: rendered by DRF's renderer, parsed back."""
    return json.loads(JSONRenderer().render(data))


def with_credits(run: Run) -> Run:
    sums = Reservation.objects.filter(run_id=run.pk).aggregate(
        reserved=Coalesce(Sum("reserved"), Decimal(0)),
        charged=Coalesce(Sum("charged"), Decimal(0)),
        refunded=Coalesce(Sum("refunded"), Decimal(0)),
    )
    held = sum(
        (r.reserved - r.charged - r.refunded for r in Reservation.objects.filter(run_id=run.pk)
         if r.settled_at is None),
        Decimal(0),
    )  # fmt: skip
    run.credits_reserved = sums["reserved"]  # type: ignore[attr-defined]
    run.credits_charged = sums["charged"]  # type: ignore[attr-defined]
    run.credits_refunded = sums["refunded"]  # type: ignore[attr-defined]
    run.credits_held = held  # type: ignore[attr-defined]
    return run


def reference_detail(run_id: Any) -> dict[str, Any]:
    """GET /runs/{id} as the ORM read it: the run with its credits, the current attempt's
    counts and progress, its children and its completed steps' outputs in plan order."""
    run = with_credits(Run.objects.get(pk=run_id))
    data = general(RunOutput(), run)
    data["plan"] = run.plan
    data["variables"] = run.variables
    counts: dict[str, dict[str, int]] = {}
    for kind, model in (("agents", Agent), ("tasks", Task), ("steps", Step)):
        rows = model.objects.filter(run=run, attempt_number=run.attempt_number)
        counted = rows.values("status").annotate(n=Count("pk")).order_by()
        counts[kind] = {row["status"]: row["n"] for row in counted}
    steps = Step.objects.filter(
        run=run, attempt_number=run.attempt_number, handler_for__isnull=True
    )
    total = steps.count()
    finished = steps.filter(status__in=STEP_TERMINAL).count()
    data["counts"] = counts
    percent = 100.0 if run.status == "completed" else 0.0
    if run.status != "completed" and total:
        percent = round(100 * finished / total, 1)
    data["progress"] = {"steps_total": total, "steps_finished": finished, "percent": percent}
    children = Run.objects.filter(parent_run=run).order_by("created_at")
    data["children"] = [
        general(ChildRunOutput(), child)
        for child in children.values("id", "status", "parent_mode", "parent_step_id", "created_at")
    ]
    data["forked_from"] = (
        {"run": str(run.forked_from_run_id), "step": run.forked_from_step}
        if run.forked_from_run_id
        else None
    )
    data["forks"] = [str(fork.pk) for fork in run.forks.order_by("created_at", "id")]
    outputs = (
        Step.objects.filter(run=run, attempt_number=run.attempt_number, status="completed")
        .order_by("task__agent__position", "task__position", "generation", "position")
        .values_list("task__agent__name", "task__name", "name", "output")
    )
    data["outputs"] = {f"{a}.{t}.{s}": output for a, t, s, output in outputs}
    data["outputs_truncated"] = False
    answer: dict[str, Any] = rendered(data)
    return answer


def reference_steps(run: Run, **filters: Any) -> list[dict[str, Any]]:
    """The run's steps as the ORM listed them, in plan order, with their names and work."""
    run.refresh_from_db()
    rows = Step.objects.filter(run=run, **filters).select_related("task__agent")
    if "attempt_number" not in filters:
        rows = rows.filter(attempt_number=run.attempt_number)
    ordered = rows.order_by(
        "task__agent__position", "task__generation", "task__position", "generation", "position"
    )
    written = []
    for step in ordered:
        step.task_name, step.agent_name = step.task.name, step.task.agent.name  # type: ignore[attr-defined]
        job = step.runner_jobs.order_by("-attempt").first() if step.tool == "runner" else None
        child = Run.objects.filter(parent_step=step).order_by("-parent_step_attempt").first()
        step.job = job.pk if job else None  # type: ignore[attr-defined]
        step.child_run = child.pk if child and step.tool == "run" else None  # type: ignore[attr-defined]
        written.append(general(StepOutput(), step))
    answer: list[dict[str, Any]] = rendered(written)
    return answer


def path(event: HistoryEvent) -> str:
    if event.entity == "step":
        step = Step.objects.select_related("task__agent").get(pk=int(event.entity_id))
        return f"{step.task.agent.name}.{step.task.name}.{step.name}"
    if event.entity == "task":
        task = Task.objects.select_related("agent").get(pk=int(event.entity_id))
        return f"{task.agent.name}.{task.name}"
    if event.entity == "agent":
        return Agent.objects.get(pk=int(event.entity_id)).name
    return ""


def reference_events(run: Run) -> list[dict[str, Any]]:
    events = []
    for event in run_history(run).order_by("id"):
        event.path = path(event)  # type: ignore[attr-defined]
        events.append(general(EventOutput(), event))
    answer: list[dict[str, Any]] = rendered(events)
    return answer


# --------------------------------------------------------------------------- answers
def test_a_runs_detail_is_what_the_orm_reads_of_it(tenant: Tenant, run: Run) -> None:
    answer = tenant.get(f"/api/v1/runs/{run.pk}")

    assert answer.status_code == 200
    assert answer.json() == reference_detail(run.pk)
    assert list(answer.json()) == list(reference_detail(run.pk))  # the fields' order too


def test_a_runs_detail_past_the_outputs_it_reads_inline_reads_them_all(tenant: Tenant) -> None:
    run = completed(tenant.organization, steps=OUTPUTS_INLINE // 4 + 1)  # 4 tasks

    answer = tenant.get(f"/api/v1/runs/{run.pk}")

    assert len(answer.json()["outputs"]) > OUTPUTS_INLINE
    assert answer.json() == reference_detail(run.pk)


def test_a_runs_detail_without_its_plan_and_outputs_leaves_only_them_out(
    tenant: Tenant, run: Run
) -> None:
    whole = reference_detail(run.pk)

    answer = tenant.get(f"/api/v1/runs/{run.pk}", {"exclude": "plan,outputs"})

    assert answer.json() == {
        key: value
        for key, value in whole.items()
        if key not in ("plan", "outputs", "outputs_truncated")
    }


def test_a_runs_steps_are_what_the_orm_lists_under_every_filter(tenant: Tenant, run: Run) -> None:
    reference = reference_steps(run)
    some = reference[0] if reference else {"task_id": 1, "tool": "noop", "status": "pending"}
    asked: dict[str, dict[str, Any]] = {
        "": {},
        "task": {"task_id": some["task_id"]},
        "tool": {"tool": some["tool"]},
        "status": {"status": some["status"]},
        "attempt": {"attempt_number": 1},
    }

    for name, filters in asked.items():
        query = {name: str(next(iter(filters.values())))} if name else {}
        answer = tenant.get(f"/api/v1/runs/{run.pk}/steps", query)
        assert answer.status_code == 200
        expected = reference_steps(run, **filters)
        assert answer.json()["results"] == expected, name
        assert answer.json()["count"] == len(expected), name
    paged, link = [], f"/api/v1/runs/{run.pk}/steps?page_size=1"
    while link:
        page = tenant.get(link).json()
        assert page["count"] == len(reference)
        paged += page["results"]
        link = page["next"]
    assert paged == reference


def test_a_runs_events_are_what_the_orm_lists_followed_both_ways(tenant: Tenant, run: Run) -> None:
    reference = reference_events(run)

    pages, link = [], f"/api/v1/runs/{run.pk}/events?page_size=2"
    while link:
        last = tenant.get(link).json()
        pages.append(last["results"])
        link = last["next"]
    back, link = [last["results"]], last["previous"]
    while link:
        page = tenant.get(link).json()
        back.insert(0, page["results"])
        link = page["previous"]

    assert [event for page in pages for event in page] == reference
    assert [event for page in back for event in page] == reference


def test_events_by_kind_attempt_and_after_are_those_the_orm_finds(tenant: Tenant) -> None:
    run = states.failed(tenant.organization)
    services.run_retry(run_id=run.pk)
    events = reference_events(run)
    some = events[3]["id"]

    for query, keep in (
        ({"kind": "transition"}, lambda e: e["kind"] == "transition"),
        ({"attempt": "1"}, lambda e: e["attempt_number"] == 1),
        ({"after": str(some)}, lambda e: e["id"] > some),
        ({"after": str(some), "kind": "transition"},
         lambda e: e["id"] > some and e["kind"] == "transition"),
    ):  # fmt: skip
        answer = tenant.get(f"/api/v1/runs/{run.pk}/events", {**query, "page_size": "500"})
        assert answer.json()["results"] == [e for e in events if keep(e)], query


def test_runs_by_status_are_the_lists_general_answer_page_by_page(tenant: Tenant) -> None:
    for make in STATES.values():
        make(tenant.organization)
    # Ties of created_at break by id, newest first: as the general path orders them.
    Run.objects.filter(organization=tenant.organization).update(
        created_at=timezone.now() - timedelta(minutes=1)
    )
    statuses = ["running", "completed", "cancelled", "created", "pending", "paused"]

    for page in (1, 2, 3, 4):
        query = {"status": statuses, "page_size": "2", "page": str(page)}
        fast = tenant.get("/api/v1/runs", query)
        general_path = tenant.get("/api/v1/runs", {**query, "ordering": "-created_at"})
        assert fast.status_code == general_path.status_code, page
        if fast.status_code != 200:
            assert page > 1  # past the end
            continue
        assert fast.json()["results"] == general_path.json()["results"], page
        assert fast.json()["count"] == general_path.json()["count"], page
        assert bool(fast.json()["next"]) == bool(general_path.json()["next"]), page
        assert bool(fast.json()["previous"]) == bool(general_path.json()["previous"]), page


@pytest.mark.parametrize(
    "query",
    [{}, {"ordering": "-priority"}, {"ordering": "status", "name": "with"}, {"priority": "5"}],
    ids=["newest-first", "by-priority", "by-status-named", "of-a-priority"],
)
def test_every_other_list_is_the_runs_the_orm_lists(tenant: Tenant, query: dict[str, str]) -> None:
    for make in STATES.values():
        make(tenant.organization)
    ordering = query.get("ordering", "-created_at")
    runs = Run.objects.filter(organization=tenant.organization, deleted_at__isnull=True)
    if "name" in query:
        runs = runs.filter(name__icontains=query["name"])
    if "priority" in query:
        runs = runs.filter(priority=int(query["priority"]))
    ordered = runs.order_by(ordering, "-pk" if ordering.startswith("-") else "pk")
    reference = rendered([general(RunOutput(), with_credits(run)) for run in ordered])

    answer = tenant.get("/api/v1/runs", {**query, "page_size": "500"})

    assert answer.json()["results"] == reference
    assert answer.json()["count"] == len(reference)


def test_no_run_in_those_states_is_an_empty_first_page_and_a_404_after(tenant: Tenant) -> None:
    first = tenant.get("/api/v1/runs", {"status": "escalated"})
    second = tenant.get("/api/v1/runs", {"status": "escalated", "page": "2"})

    assert first.json() == {"count": 0, "next": None, "previous": None, "results": []}
    assert second.status_code == 404


# --------------------------------------------------------------------------- the rows
@pytest.mark.parametrize("zone", ["UTC", "Europe/Paris"])
def test_rows_written_the_short_way_are_drfs_in_any_time_zone(tenant: Tenant, zone: str) -> None:
    run = with_credits(completed(tenant.organization))
    run.credits_charged = Decimal("1.2345675")  # type: ignore[attr-defined] # rounds half even
    run.started_at = datetime(2026, 1, 2, 3, 4, 5, tzinfo=ZoneInfo("Asia/Tokyo"))
    run.completed_at = datetime(2026, 1, 2, 3, 4, 5, 0, tzinfo=UTC)
    step = Step.objects.filter(run=run).first()
    assert step is not None
    step.task_name, step.agent_name = "t", "a"  # type: ignore[attr-defined]
    step.job = step.child_run = None  # type: ignore[attr-defined]
    event = run_history(run).first()

    with timezone.override(ZoneInfo(zone)):
        for output, row in ((RunOutput, run), (StepOutput, step), (EventOutput, event)):
            assert output.row(row) == general(output(), row), output.__name__
            assert output(row).data == general(output(), row), output.__name__
