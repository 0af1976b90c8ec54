"""The schedules' routes: what each answers, what each refuses (a stable code and the
field's path, nothing stored), and the runs list's `?schedule=`."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
import yaml

from runs.models import Run
from schedules import services
from schedules.models import Schedule, ScheduleFire
from tests.schedules.conftest import scheduled_plan
from tests.tenants import Tenant, make_tenant

pytestmark = pytest.mark.django_db

SCHEDULES = "/api/v1/schedules"


OMIT: Any = object()  # a field left out of the body


def body(**fields: Any) -> dict[str, Any]:
    sent = {"name": "nightly", "plan": scheduled_plan(), "cron": "30 2 * * *", **fields}
    return {name: value for name, value in sent.items() if value is not OMIT}


def create(tenant: Tenant, **fields: Any) -> dict[str, Any]:
    response = tenant.post(SCHEDULES, body(**fields))
    assert response.status_code == 201, response.json()
    created: dict[str, Any] = response.json()
    return created


def test_a_schedule_is_created_and_answered_as_it_reads(tenant: Tenant) -> None:
    response = tenant.post(
        SCHEDULES,
        body(timezone="Europe/Paris", overlap="allow", catchup="latest", variables={"a": 1}),
    )

    assert response.status_code == 201, response.json()
    created = response.json()
    assert response["Location"] == f"{SCHEDULES}/{created['id']}"
    assert {key: created[key] for key in ("name", "status", "cron", "interval", "timezone")} == {
        "name": "nightly",
        "status": "active",
        "cron": "30 2 * * *",
        "interval": None,
        "timezone": "Europe/Paris",
    }
    assert (created["overlap"], created["catchup"], created["variables"]) == (
        "allow",
        "latest",
        {"a": 1},
    )
    assert created["next_due_at"].endswith(":30:00Z")
    assert (created["last_due_at"], created["last_run"]) == (None, None)
    assert created["plan"] == scheduled_plan()
    assert created["created_by"].startswith("api:")
    assert tenant.get(f"{SCHEDULES}/{created['id']}").json() == created


def test_an_interval_is_answered_in_the_plans_duration_syntax(tenant: Tenant) -> None:
    for written, shown in ((90, "90s"), ("1.5h", "90m"), ("2d", "2d"), (0.5 * 60, "30s")):
        created = create(tenant, cron=OMIT, interval=written)
        assert (created["interval"], created["cron"]) == (shown, None)


def test_a_schedule_may_be_written_in_yaml(tenant: Tenant) -> None:
    text = yaml.safe_dump(body(interval="5m", cron=OMIT))

    response = tenant.client.post(SCHEDULES, text, content_type="application/yaml")

    assert response.status_code == 201, response.json()
    assert response.json()["interval"] == "5m"


@pytest.mark.parametrize(
    ("fields", "path", "code"),
    [
        ({"cron": "30 25 * * *"}, "cron", "invalid_cron"),
        ({"cron": OMIT, "interval": "10ms"}, "interval", "invalid_interval"),
        ({"cron": OMIT, "interval": True}, "interval", "invalid_interval"),
        ({"cron": OMIT, "interval": "every day"}, "interval", "invalid_interval"),
        ({"timezone": "Europe/Atlantis"}, "timezone", "invalid_timezone"),
        ({"interval": "1m"}, "interval", "invalid"),
        ({"cron": None}, "cron", "null"),
        ({"overlap": "sometimes"}, "overlap", "invalid_choice"),
        ({"start_at": "yesterday"}, "start_at", "invalid"),
        ({"end_at": "2000-01-01T00:00:00Z"}, "end_at", "invalid"),
        ({"variables": [1]}, "variables", "not_a_dict"),
        ({"status": "active"}, "status", "invalid"),
    ],
)
def test_a_malformed_field_is_400_naming_it_with_a_code_and_nothing_is_stored(
    tenant: Tenant, fields: dict[str, Any], path: str, code: str
) -> None:
    response = tenant.post(SCHEDULES, body(**fields))

    assert response.status_code == 400, response.json()
    answer = response.json()
    assert answer["code"] == "invalid_request"
    assert [(problem["path"], problem["code"]) for problem in answer["details"]] == [(path, code)]
    assert answer["message"].startswith(f"invalid request: {path}: ")
    assert not Schedule.objects.exists()


def test_neither_cron_nor_interval_is_400(tenant: Tenant) -> None:
    response = tenant.post(SCHEDULES, {"name": "n", "plan": scheduled_plan()})

    assert response.status_code == 400
    assert response.json()["details"] == [
        {"path": "cron", "message": "give either cron or interval", "code": "required"}
    ]


def test_a_plan_problem_is_invalid_plan_with_its_path_in_the_body(tenant: Tenant) -> None:
    plan = scheduled_plan()
    plan["agents"][0]["tasks"][0]["steps"][0]["tool"] = "tleporter"

    response = tenant.post(SCHEDULES, body(plan=plan))

    assert response.status_code == 400
    assert response.json()["code"] == "invalid_plan"
    assert response.json()["details"][0]["path"] == "plan.agents[0].tasks[0].steps[0].tool"
    assert not Schedule.objects.exists()


def test_a_schedule_is_listed_read_changed_and_deleted(tenant: Tenant) -> None:
    first = create(tenant, name="first")
    second = create(tenant, name="second")
    services.schedule_pause(schedule_id=second["id"])

    listed = tenant.get(SCHEDULES).json()
    assert [row["name"] for row in listed["results"]] == ["second", "first"]
    assert "plan" not in listed["results"][0]
    assert [
        row["name"] for row in tenant.get(SCHEDULES, {"status": "paused"}).json()["results"]
    ] == ["second"]
    assert tenant.get(SCHEDULES, {"status": "sleeping"}).status_code == 400

    path = f"{SCHEDULES}/{first['id']}"
    changed = tenant.client.patch(path, {"interval": "15m", "name": "renamed"}, format="json")
    assert changed.status_code == 200, changed.json()
    assert (changed.json()["name"], changed.json()["interval"], changed.json()["cron"]) == (
        "renamed",
        "15m",
        None,
    )
    refused = tenant.client.patch(path, {"timezone": "Nowhere"}, format="json")
    assert refused.status_code == 400
    assert refused.json()["details"][0]["code"] == "invalid_timezone"
    assert tenant.get(path).json()["name"] == "renamed"

    assert tenant.client.delete(path).status_code == 204
    assert tenant.get(path).status_code == 404
    assert tenant.client.delete(path).status_code == 404


def test_pause_resume_and_trigger_are_actions(tenant: Tenant) -> None:
    created = create(tenant)
    path = f"{SCHEDULES}/{created['id']}"

    assert created["paused_reason"] is None
    paused = tenant.post(f"{path}/pause")
    assert (paused.status_code, paused.json()["status"]) == (200, "paused")
    assert paused.json()["paused_reason"] == "manual"
    fired = tenant.post(f"{path}/trigger")
    assert fired.status_code == 200, fired.json()
    assert (fired.json()["kind"], fired.json()["status"]) == ("manual", "fired")
    run_id = fired.json()["run"]["id"]
    assert fired.json()["run"] == {"id": run_id, "status": "pending"}
    resumed = tenant.post(f"{path}/resume")
    assert (resumed.json()["status"], resumed.json()["last_run"]) == (
        "active",
        {"id": run_id, "status": "pending"},
    )
    assert resumed.json()["paused_reason"] is None

    history = tenant.get(f"{path}/fires").json()
    assert history["count"] == 1
    assert history["results"][0]["run"]["id"] == run_id
    assert tenant.post(f"{path}/pause", {"now": "x"}).status_code == 400


def test_a_trigger_without_credits_is_402_and_records_nothing() -> None:
    broke = make_tenant(credits=0)
    created = create(broke)

    response = broke.post(f"{SCHEDULES}/{created['id']}/trigger")

    assert response.status_code == 402
    assert response.json()["code"] == "insufficient_credits"
    assert not ScheduleFire.objects.exists()


def test_a_skipped_due_time_is_listed_with_its_reason() -> None:
    broke = make_tenant(credits=0)
    created = create(broke, cron=OMIT, interval="1m")
    schedule = Schedule.objects.get()
    services.schedules_fire_due(now=schedule.created_at + timedelta(minutes=1))

    fires = broke.get(f"{SCHEDULES}/{created['id']}/fires").json()["results"]

    assert [(fire["status"], fire["reason"], fire["run"]) for fire in fires] == [
        ("skipped", "insufficient_credits", None)
    ]
    assert fires[0]["message"].startswith("needs ")
    shown = broke.get(f"{SCHEDULES}/{created['id']}").json()
    assert shown["last_due_at"] == fires[0]["due_at"]
    assert shown["last_run"] is None


def test_the_runs_list_filters_by_schedule(tenant: Tenant, other_tenant: Tenant) -> None:
    created = create(tenant, cron=OMIT, interval="1m", overlap="allow")
    schedule = Schedule.objects.get()
    for minutes in (1, 2):
        services.schedules_fire_due(now=schedule.created_at + timedelta(minutes=minutes))
    tenant.post("/api/v1/runs", {"plan": scheduled_plan()})  # not scheduled

    listed = tenant.get("/api/v1/runs", {"schedule": created["id"]}).json()
    foreign = other_tenant.get("/api/v1/runs", {"schedule": created["id"]}).json()

    assert {row["id"] for row in listed["results"]} == {
        str(run_id) for run_id in ScheduleFire.objects.values_list("run_id", flat=True)
    }
    assert listed["count"] == 2
    assert Run.objects.count() == 3
    assert foreign["count"] == 0
    malformed = tenant.get("/api/v1/runs", {"schedule": "nightly"})
    assert malformed.status_code == 400
    assert malformed.json()["details"][0]["path"] == "schedule"


def test_another_organizations_schedule_is_not_found(tenant: Tenant, other_tenant: Tenant) -> None:
    created = create(tenant)
    path = f"{SCHEDULES}/{created['id']}"

    for method, suffix in (
        ("get", ""),
        ("patch", ""),
        ("delete", ""),
        ("post", "/pause"),
        ("post", "/resume"),
        ("post", "/trigger"),
        ("get", "/fires"),
    ):
        response = getattr(other_tenant.client, method)(path + suffix, {}, format="json")
        assert response.status_code == 404, (method, suffix)
        assert response.json() == {"code": "not_found", "message": "not found", "details": None}
    assert other_tenant.get(SCHEDULES).json()["count"] == 0
    assert tenant.get(path).json()["status"] == "active"


def test_a_schedule_that_paused_itself_for_credits_says_so(settings: Any) -> None:
    settings.SCHEDULES_PAUSE_AFTER_CREDIT_REFUSALS = 2
    broke = make_tenant(credits=0)
    created = create(broke, cron=OMIT, interval="1m")
    schedule = Schedule.objects.get()
    for minutes in (1, 2):
        services.schedules_fire_due(now=schedule.created_at + timedelta(minutes=minutes))

    shown = broke.get(f"{SCHEDULES}/{created['id']}").json()

    assert (shown["status"], shown["paused_reason"]) == ("paused", "insufficient_credits")
    listed = broke.get(SCHEDULES, {"status": "paused"}).json()["results"]
    assert [row["paused_reason"] for row in listed] == ["insufficient_credits"]
