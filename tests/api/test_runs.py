"""The runs API end to end in process: each route does what docs/api.md says."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from api.runs import EXAMPLE_CREATE
from billing.models import LedgerEntry
from runs import services
from runs.engine import control
from runs.engine.start import run_start
from runs.models import Run, Step
from runs.selectors import run_history
from tests import factories
from tests.api import states
from tests.tenants import Tenant

pytestmark = pytest.mark.django_db

RUNS = "/api/v1/runs"


def create(tenant: Tenant, start: bool = False, **plan: Any) -> Any:
    return tenant.post(RUNS, {"plan": factories.plan(**plan), "start": start})


# --------------------------------------------------------------------------- create
def test_create_stores_a_created_run_and_answers_201_with_its_location(tenant: Tenant) -> None:
    response = create(tenant, name="research", priority=2)

    body = response.json()
    assert response.status_code == 201
    assert response.headers["Location"] == f"{RUNS}/{body['id']}"
    assert (body["status"], body["priority"], body["attempt_number"]) == ("created", 2, 0)
    assert body["plan"] == factories.plan(name="research", priority=2)
    assert body["credits"] == {
        "reserved": "0.000000",
        "charged": "0.000000",
        "refunded": "0.000000",
        "held": "0.000000",
    }
    assert body["created_by"].startswith("api:")
    assert Run.objects.get(pk=body["id"]).organization == tenant.organization


def test_create_with_start_reserves_credits_and_leaves_the_run_pending(tenant: Tenant) -> None:
    body = create(tenant, start=True, steps=3).json()

    assert body["status"] == "pending"
    assert body["attempt_number"] == 1
    assert body["credits"]["reserved"] == body["credits"]["held"] == "0.090000"
    assert LedgerEntry.objects.filter(run_id=body["id"], type="reserve").count() == 1


def test_an_invalid_plan_is_400_with_every_problem_and_its_path(tenant: Tenant) -> None:
    plan = factories.plan()
    plan["agents"][0]["tasks"][0]["steps"][0]["tool"] = "serach"
    plan["agents"][0]["tasks"][0]["depends_on"] = ["gahter"]

    response = tenant.post(RUNS, {"plan": plan})

    body = response.json()
    assert response.status_code == 400
    assert body["code"] == "invalid_plan"
    paths = {problem["path"] for problem in body["details"]}
    assert {"agents[0].tasks[0].steps[0].tool", "agents[0].tasks[0].depends_on"} <= paths
    assert body["message"].startswith("the plan is invalid: ")
    assert not Run.objects.exists()


def test_an_unknown_error_code_is_answered_with_the_valid_ones(tenant: Tenant) -> None:
    plan = factories.plan()
    plan["agents"][0]["tasks"][0]["steps"][0].update(tool="fail", params={"code": "boom"})
    plan["agents"][0]["tasks"][0]["steps"][0]["retry"] = {"retry_on": ["timout"]}

    response = tenant.post(RUNS, {"plan": plan})

    body = response.json()
    assert (response.status_code, body["code"]) == (400, "invalid_plan")
    problems = {problem["path"]: problem["message"] for problem in body["details"]}
    step = "agents[0].tasks[0].steps[0]"
    assert problems[f"{step}.params.code"].startswith("unknown error code 'boom'; the codes: ")
    assert "tool_error" in problems[f"{step}.params.code"]
    assert "retryable codes (" in problems[f"{step}.retry.retry_on[0]"]
    assert "gateway_timeout" in problems[f"{step}.retry.retry_on[0]"]


def test_a_missing_plan_is_400_invalid_request_naming_the_field(tenant: Tenant) -> None:
    response = tenant.post(RUNS, {"start": True})

    assert response.status_code == 400
    assert response.json()["code"] == "invalid_request"
    assert response.json()["details"][0]["path"] == "plan"


@pytest.mark.parametrize("start", ["yes", 1, "true", None])
def test_start_must_be_a_json_boolean(tenant: Tenant, start: Any) -> None:
    response = tenant.post(RUNS, {"plan": factories.plan(), "start": start})

    assert response.status_code == 400
    assert response.json()["details"][0]["path"] == "start"


def test_create_and_start_without_enough_credits_is_402_and_creates_nothing(
    new_tenant: Any,
) -> None:
    poor = new_tenant(credits=0)

    response = create(poor, start=True)

    assert response.status_code == 402
    assert response.json()["code"] == "insufficient_credits"
    assert response.json()["details"] == {"needed": "0.060000", "available": "0.000000"}
    assert not Run.objects.filter(organization=poor.organization).exists()


# --------------------------------------------------------------------------- list
def test_the_list_is_paginated_newest_first_with_a_capped_page_size(
    tenant: Tenant, settings: Any
) -> None:
    settings.API_MAX_PAGE_SIZE = 3
    runs = [states.created(tenant.organization) for _ in range(5)]

    first = tenant.get(RUNS, {"page_size": 1000}).json()
    second = tenant.get(RUNS, {"page_size": 1000, "page": 2}).json()

    assert first["count"] == 5
    assert [row["id"] for row in first["results"] + second["results"]] == [
        str(run.pk) for run in reversed(runs)
    ]
    assert "page=2" in first["next"]
    assert first["previous"] is None
    assert second["next"] is None
    assert "page=1" in second["previous"]


def test_the_default_page_size_comes_from_settings(tenant: Tenant, settings: Any) -> None:
    settings.API_PAGE_SIZE = 2
    for _ in range(3):
        states.created(tenant.organization)

    assert len(tenant.get(RUNS).json()["results"]) == 2


def test_a_page_past_the_end_is_404(tenant: Tenant) -> None:
    states.created(tenant.organization)

    response = tenant.get(RUNS, {"page": 2})

    assert response.status_code == 404
    assert response.json()["code"] == "not_found"


def test_the_list_filters_by_status_name_priority_and_creation_time(tenant: Tenant) -> None:
    created = states.created(tenant.organization)
    running = states.running(tenant.organization)
    failed = states.failed(tenant.organization)
    special = factories.run(tenant.organization, name="Market-Research", priority=1)
    Run.objects.filter(pk=created.pk).update(created_at=timezone.now() - timedelta(days=2))

    def ids(**params: Any) -> set[str]:
        response = tenant.get(RUNS, params)
        assert response.status_code == 200, response.json()
        return {row["id"] for row in response.json()["results"]}

    assert ids(status=["running", "failed"]) == {str(running.pk), str(failed.pk)}
    assert ids(name="market") == {str(special.pk)}
    assert ids(priority=1) == {str(special.pk)}
    yesterday = (timezone.now() - timedelta(days=1)).isoformat()
    assert ids(created_before=yesterday) == {str(created.pk)}
    assert str(created.pk) not in ids(created_after=yesterday)


def test_the_list_orders_as_asked(tenant: Tenant) -> None:
    for priority in (5, 1, 9):
        factories.run(tenant.organization, priority=priority)

    rows = tenant.get(RUNS, {"ordering": "priority"}).json()["results"]

    assert [row["priority"] for row in rows] == [1, 5, 9]


@pytest.mark.parametrize(
    ("params", "path"),
    [
        ({"status": "sleeping"}, "status"),
        ({"priority": 10}, "priority"),
        ({"ordering": "organization"}, "ordering"),
        ({"created_after": "yesterday"}, "created_after"),
        ({"page": 0}, "page"),
        ({"page_size": -1}, "page_size"),
        ({"name": "x" * 201}, "name"),
    ],
)
def test_a_bad_query_parameter_is_400_naming_it(
    tenant: Tenant, params: dict[str, Any], path: str
) -> None:
    response = tenant.get(RUNS, params)

    assert response.status_code == 400
    assert response.json()["code"] == "invalid_request"
    assert response.json()["details"][0]["path"] == path


def test_lists_run_a_bounded_number_of_queries_whatever_their_length(tenant: Tenant) -> None:
    def queries(run: Run) -> dict[str, int]:
        counts = {}
        for name, path in _list_paths(run).items():
            with CaptureQueriesContext(connection) as captured:
                assert tenant.get(path, {"page_size": 500}).status_code == 200
            counts[name] = len(captured)
        return counts

    tenant.get(RUNS)  # the key's last_used_at is written at most once a minute
    small = queries(states.running(tenant.organization))
    for _ in range(10):
        states.failed(tenant.organization)
    big = services.run_create(
        organization=tenant.organization, plan=factories.plan(agents=3, tasks=3, steps=4)
    )
    run_start(run_id=big.pk)
    control.pick_up(big.pk)
    services.run_cancel(run_id=big.pk)
    large = queries(big)

    assert small == large
    assert max(large.values()) <= 5, large


def _list_paths(run: Run) -> dict[str, str]:
    children = ("agents", "tasks", "steps", "events")
    return {
        "runs": RUNS,
        "ledger": "/api/v1/billing/ledger",
        **{child: f"{RUNS}/{run.pk}/{child}" for child in children},
    }


# --------------------------------------------------------------------------- retrieve
def test_a_run_shows_its_counts_progress_and_credits(tenant: Tenant) -> None:
    run = states.running(tenant.organization)
    step = Step.objects.filter(run=run).order_by("position").first()
    factories.finish_all_work(run)  # every step completed, as the engine would
    assert step is not None

    body = tenant.get(f"{RUNS}/{run.pk}").json()

    assert body["status"] == "running"
    assert body["counts"] == {
        "agents": {"completed": 1},
        "tasks": {"completed": 1},
        "steps": {"completed": 2},
    }
    assert body["progress"] == {"steps_total": 2, "steps_finished": 2, "percent": 100.0}
    assert body["credits"]["reserved"] == "0.060000"
    assert body["last_error"] is None


def test_a_failed_run_shows_its_last_error(tenant: Tenant) -> None:
    run = states.failed(tenant.organization)

    body = tenant.get(f"{RUNS}/{run.pk}").json()

    assert body["status"] == "failed"
    assert body["last_error"] == {"code": "tool_error", "message": "boom"}
    credits = body["credits"]
    assert credits["refunded"] == credits["reserved"]
    assert credits["held"] == "0.000000"


# --------------------------------------------------------------------------- delete
def test_delete_soft_deletes_a_created_run_and_hides_it_from_the_list(tenant: Tenant) -> None:
    run = states.created(tenant.organization)

    response = tenant.client.delete(f"{RUNS}/{run.pk}")
    again = tenant.client.delete(f"{RUNS}/{run.pk}")

    assert (response.status_code, again.status_code) == (204, 204)
    assert tenant.get(RUNS).json()["count"] == 0
    shown = tenant.get(f"{RUNS}/{run.pk}").json()
    assert shown["deleted_at"] is not None
    assert shown["status"] == "cancelled"
    refused = tenant.post(f"{RUNS}/{run.pk}/start")
    assert refused.status_code == 409
    assert refused.json()["code"] == "run_deleted"


def test_delete_is_409_once_the_run_has_started(tenant: Tenant) -> None:
    run = states.pending(tenant.organization)

    response = tenant.client.delete(f"{RUNS}/{run.pk}")

    assert response.status_code == 409
    assert response.json()["code"] == "invalid_transition"
    assert response.json()["details"] == {"entity": "run", "from": "pending", "to": "deleted"}
    assert Run.objects.get(pk=run.pk).deleted_at is None


# --------------------------------------------------------------------------- control
def test_start_reserves_and_a_second_start_changes_nothing(tenant: Tenant) -> None:
    run = states.created(tenant.organization)

    first = tenant.post(f"{RUNS}/{run.pk}/start")
    second = tenant.post(f"{RUNS}/{run.pk}/start")

    assert (first.status_code, second.status_code) == (200, 200)
    assert first.json()["status"] == second.json()["status"] == "pending"
    assert LedgerEntry.objects.filter(run=run, type="reserve").count() == 1


def test_a_start_that_begins_the_run_answers_running_and_a_second_changes_nothing(
    tenant: Tenant, settings: Any
) -> None:
    settings.ENGINE_START_AT_ONCE_STEPS = 200  # a small run admitted at once begins at once
    run = states.created(tenant.organization)

    first = tenant.post(f"{RUNS}/{run.pk}/start")
    events = run_history(run).count()
    second = tenant.post(f"{RUNS}/{run.pk}/start")

    assert (first.status_code, second.status_code) == (200, 200)
    assert first.json()["status"] == second.json()["status"] == "running"
    assert run_history(run).count() == events
    assert LedgerEntry.objects.filter(run=run, type="reserve").count() == 1


def test_create_with_start_may_answer_a_running_run(tenant: Tenant, settings: Any) -> None:
    settings.ENGINE_START_AT_ONCE_STEPS = 200

    body = create(tenant, start=True, steps=3).json()

    assert body["status"] == "running"
    assert body["attempt_number"] == 1


def test_start_without_enough_credits_is_402_and_the_run_stays_created(new_tenant: Any) -> None:
    poor = new_tenant(credits=0)
    run = states.created(poor.organization)

    response = poor.post(f"{RUNS}/{run.pk}/start")

    assert response.status_code == 402
    assert Run.objects.get(pk=run.pk).status == "created"


def test_cancel_records_the_reason_and_refunds(tenant: Tenant) -> None:
    run = states.running(tenant.organization)

    body = tenant.post(f"{RUNS}/{run.pk}/cancel", {"reason": "wrong topic"}).json()

    assert body["status"] == "cancelled"
    assert body["cancel_reason"] == "wrong topic"
    assert body["credits"]["held"] == "0.000000"
    assert body["credits"]["refunded"] == body["credits"]["reserved"]


def test_a_cancel_reason_over_the_limit_is_refused_even_if_trimming_would_fit(
    tenant: Tenant,
) -> None:
    run = states.running(tenant.organization)

    response = tenant.post(f"{RUNS}/{run.pk}/cancel", {"reason": "x" * 1000 + "   "})

    assert response.status_code == 400
    assert response.json()["details"] == [
        {
            "path": "reason",
            "message": "Ensure this field has no more than 1000 characters.",
            "code": "max_length",
        }
    ]
    assert Run.objects.get(pk=run.pk).status == "running"


def test_a_terminal_run_cannot_be_paused_409_with_from_and_to(tenant: Tenant) -> None:
    run = states.failed(tenant.organization)

    response = tenant.post(f"{RUNS}/{run.pk}/pause")

    assert response.status_code == 409
    assert response.json() == {
        "code": "invalid_transition",
        "message": "run cannot go from failed to paused",
        "details": {"entity": "run", "from": "failed", "to": "paused"},
    }


def test_pause_then_resume(tenant: Tenant) -> None:
    run = states.running(tenant.organization)

    paused = tenant.post(f"{RUNS}/{run.pk}/pause").json()
    resumed = tenant.post(f"{RUNS}/{run.pk}/resume").json()

    assert paused["status"] == "paused"
    assert resumed["status"] == "resuming"


def test_retry_opens_a_new_attempt_until_attempts_are_exhausted(tenant: Tenant) -> None:
    run = factories.run(tenant.organization, max_attempts=2)
    run_start(run_id=run.pk)
    services.run_fail(run_id=run.pk, code="tool_error", message="boom")

    retried = tenant.post(f"{RUNS}/{run.pk}/retry").json()
    services.run_fail(run_id=run.pk, code="tool_error", message="boom again")
    exhausted = tenant.post(f"{RUNS}/{run.pk}/retry")

    assert (retried["status"], retried["attempt_number"]) == ("retrying", 2)
    assert exhausted.status_code == 409
    assert exhausted.json()["code"] == "attempts_exhausted"


def test_approve_completes_the_waiting_step_and_the_run_moves_on(tenant: Tenant) -> None:
    run = states.waiting_approval(tenant.organization)
    step = Step.objects.get(run=run, status="waiting_approval")

    response = tenant.post(f"{RUNS}/{run.pk}/approve", {"step_id": step.pk, "comment": "ok"})

    body = response.json()
    assert response.status_code == 200
    assert body["steps"] == [step.pk]
    assert body["run"]["status"] == "completed"
    assert Step.objects.get(pk=step.pk).output["comment"] == "ok"


def test_approve_with_nothing_waiting_is_a_no_op(tenant: Tenant) -> None:
    run = states.running(tenant.organization)

    body = tenant.post(f"{RUNS}/{run.pk}/approve").json()

    assert body["steps"] == []
    assert body["run"]["status"] == "running"


def test_reject_fails_the_step_and_the_run(tenant: Tenant) -> None:
    run = states.waiting_approval(tenant.organization)

    body = tenant.post(f"{RUNS}/{run.pk}/reject", {"comment": "no"}).json()

    assert body["run"]["status"] == "failed"
    assert body["run"]["last_error"]["code"] == "approval_rejected"


def test_approving_a_step_of_another_run_is_404(tenant: Tenant) -> None:
    run = states.waiting_approval(tenant.organization)
    other = states.waiting_approval(tenant.organization)
    foreign_step = Step.objects.get(run=other, status="waiting_approval")

    response = tenant.post(f"{RUNS}/{run.pk}/approve", {"step_id": foreign_step.pk})

    assert response.status_code == 404
    assert Step.objects.get(pk=foreign_step.pk).status == "waiting_approval"


@pytest.mark.parametrize(
    "body", [{"step_id": "5"}, {"step_id": 0}, {"comment": 5}, {"comment": "x" * 2001}, []]
)
def test_a_malformed_decision_is_400(tenant: Tenant, body: Any) -> None:
    run = states.waiting_approval(tenant.organization)

    response = tenant.post(f"{RUNS}/{run.pk}/approve", body)

    assert response.status_code == 400
    assert response.json()["code"] == "invalid_request"


# --------------------------------------------------------------------------- hierarchy
def test_the_hierarchy_lists_agents_tasks_and_steps_of_the_current_attempt(
    tenant: Tenant,
) -> None:
    run = states.running(tenant.organization)
    base = f"{RUNS}/{run.pk}"

    agents = tenant.get(f"{base}/agents").json()["results"]
    tasks = tenant.get(f"{base}/tasks").json()["results"]
    steps = tenant.get(f"{base}/steps").json()["results"]

    assert [agent["name"] for agent in agents] == ["agent-0"]
    assert [(task["agent_name"], task["name"]) for task in tasks] == [("agent-0", "task-0")]
    assert [(s["agent_name"], s["task_name"], s["name"]) for s in steps] == [
        ("agent-0", "task-0", "step-0"),
        ("agent-0", "task-0", "step-1"),
    ]
    by_task = tenant.get(f"{base}/steps", {"task": tasks[0]["id"], "status": "pending"})
    assert by_task.json()["count"] == 2
    assert tenant.get(f"{base}/agents", {"attempt": 2}).json()["count"] == 0


def test_events_are_the_runs_history_in_order_and_can_be_followed(tenant: Tenant) -> None:
    run = states.running(tenant.organization)
    path = f"{RUNS}/{run.pk}/events"

    events = tenant.get(path, {"page_size": 500}).json()["results"]
    transitions = tenant.get(path, {"kind": "transition", "page_size": 500}).json()["results"]
    later = tenant.get(path, {"after": events[1]["id"]}).json()["results"]

    assert events[0]["kind"] == "created"
    assert [event["id"] for event in events] == sorted(event["id"] for event in events)
    assert {event["kind"] for event in transitions} == {"transition"}
    assert later == events[2:]


# --------------------------------------------------------------------------- billing
def test_balance_and_ledger_are_the_callers(tenant: Tenant) -> None:
    run = states.failed(tenant.organization)

    balance = tenant.get("/api/v1/billing/balance").json()
    ledger = tenant.get("/api/v1/billing/ledger").json()
    refunds = tenant.get("/api/v1/billing/ledger", {"type": "refund", "run": str(run.pk)})

    assert balance == {
        "available": "1000.000000",
        "reserved": "0.000000",
        "spent": "0.000000",
        "total": "1000.000000",
    }
    assert [entry["type"] for entry in ledger["results"]] == ["refund", "reserve", "grant"]
    assert [entry["amount"] for entry in refunds.json()["results"]] == ["0.060000"]


def test_an_unknown_query_parameter_is_refused_not_ignored(tenant: Tenant) -> None:
    run = states.created(tenant.organization)

    typo = tenant.get(RUNS, {"stauts": "failed"})
    on_a_detail = tenant.get(f"{RUNS}/{run.pk}", {"expand": "steps"})

    assert typo.status_code == on_a_detail.status_code == 400
    assert typo.json()["details"][0]["path"] == "stauts"


def test_the_documented_example_creates_and_starts_a_run(tenant: Tenant) -> None:
    response = tenant.post(RUNS, EXAMPLE_CREATE)

    assert response.status_code == 201, response.json()
    assert response.json()["status"] == "pending"
