"""``orch schedules`` and the client's schedule methods against a live server (no worker:
the runs a schedule starts wait, pending)."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest
import yaml

from orchestrator_client import BadRequest, Client, InvalidPlan, NotFound
from runs.models import Run
from schedules import services
from schedules.models import Schedule, ScheduleFire
from tests.client.conftest import Orch
from tests.schedules.conftest import scheduled_plan
from tests.tenants import LiveTenant

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def plan_file(directory: Path, name: str = "nightly.yaml", **plan: object) -> Path:
    path = directory / name
    document = scheduled_plan(**plan)
    document["agents"][0]["tasks"][0]["steps"][0].update(
        tool="echo", params={"message": "report for ${variables.day}"}
    )
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def test_a_yaml_plan_is_scheduled_listed_steered_and_removed(orch: Orch, tmp_path: Path) -> None:
    path = plan_file(tmp_path, variables={"day": "today"})

    created = orch.json(
        "schedules", "create", str(path),
        "--cron", "30 2 * * *", "--timezone", "Europe/Paris", "--overlap", "allow",
        "--catchup", "latest", "--var", "day=yesterday", "--var", "note=a=b \u00e9\U0001f600",
    )  # fmt: skip

    assert (created["name"], created["cron"], created["timezone"]) == (
        "nightly",
        "30 2 * * *",
        "Europe/Paris",
    )
    assert created["variables"] == {"day": "yesterday", "note": "a=b \u00e9\U0001f600"}
    assert (created["overlap"], created["catchup"], created["status"]) == (
        "allow",
        "latest",
        "active",
    )
    schedule_id = created["id"]

    listed = orch.run("schedules", "ls")
    assert listed.returncode == 0, listed.stderr
    assert schedule_id in listed.stdout
    assert "cron 30 2 * * *" in listed.stdout
    assert [row["id"] for row in orch.json("schedules", "ls", "--status", "active")] == [
        schedule_id
    ]

    paused = orch.run("schedules", "pause", schedule_id)
    assert paused.returncode == 0, paused.stderr
    assert f"schedule {schedule_id}: paused" in paused.stdout

    fire = orch.json("schedules", "trigger", schedule_id)
    assert (fire["kind"], fire["status"], fire["run"]["status"]) == ("manual", "fired", "pending")
    run = Run.objects.get(pk=fire["run"]["id"])
    assert run.variables == {"day": "yesterday", "note": "a=b \u00e9\U0001f600"}

    resumed = orch.json("schedules", "resume", schedule_id)
    assert resumed["status"] == "active"
    assert resumed["last_run"] == {"id": fire["run"]["id"], "status": "pending"}

    shown = orch.run("schedules", "show", schedule_id)
    assert shown.returncode == 0, shown.stderr
    assert "when      cron 30 2 * * * (Europe/Paris)" in shown.stdout
    assert f"last run  {fire['run']['id']} (pending)" in shown.stdout
    assert "manual" in shown.stdout

    removed = orch.run("schedules", "rm", schedule_id)
    assert removed.returncode == 0, removed.stderr
    assert not Schedule.objects.exists()
    assert Run.objects.filter(pk=run.pk).exists()
    gone = orch.run("schedules", "rm", schedule_id)
    assert gone.returncode == 1
    assert "not_found" in gone.stderr


def test_an_interval_schedule_from_a_json_plan_named_by_its_file(
    orch: Orch, tmp_path: Path
) -> None:
    path = tmp_path / "every-five.json"
    path.write_text(json.dumps(scheduled_plan()))

    created = orch.json("schedules", "create", str(path), "--every", "5m")

    assert (created["name"], created["interval"], created["cron"]) == ("every-five", "5m", None)


def test_refusals_exit_with_the_apis_code_and_usage_errors_with_2(
    orch: Orch, tmp_path: Path
) -> None:
    path = plan_file(tmp_path)  # ${variables.day} and no variables: an invalid plan

    bad_cron = orch.run("schedules", "create", str(path), "--cron", "61 * * * *", "--var", "day=x")
    assert bad_cron.returncode == 1
    assert "invalid_request: invalid request: cron: minute: '61'" in bad_cron.stderr
    bad_plan = orch.run("schedules", "create", str(path), "--cron", "0 * * * *")
    assert bad_plan.returncode == 1
    assert "invalid_plan" in bad_plan.stderr
    assert "plan.agents[0].tasks[0].steps[0].params.message: unknown variable 'day'" in (
        bad_plan.stderr
    )
    both = orch.run("schedules", "create", str(path), "--cron", "0 * * * *", "--every", "1m")
    assert both.returncode == 2
    assert "give either --cron or --interval" in both.stderr
    bad_var = orch.run("schedules", "create", str(path), "--every", "1m", "--var", "day")
    assert bad_var.returncode == 2
    assert not Schedule.objects.exists()


def test_the_client_covers_every_schedule_route(tenant: LiveTenant) -> None:
    with Client(tenant.url, tenant.key, timeout=10) as api:
        created = api.create_schedule(
            scheduled_plan(), name="every-minute", interval="1m", overlap="allow"
        )
        schedule = Schedule.objects.get()
        services.schedules_fire_due(now=schedule.created_at + timedelta(minutes=1))

        assert api.get_schedule(created["id"])["last_run"]["status"] == "pending"
        assert [row["id"] for row in api.schedules(status="active")] == [created["id"]]
        (fire,) = api.schedule_fires(created["id"])
        assert (fire["kind"], fire["status"]) == ("scheduled", "fired")
        assert [run["id"] for run in api.runs(schedule=created["id"])] == [fire["run"]["id"]]

        changed = api.update_schedule(created["id"], cron="@hourly", end_at=None)
        assert (changed["cron"], changed["interval"]) == ("@hourly", None)
        assert api.pause_schedule(created["id"])["status"] == "paused"
        assert api.resume_schedule(created["id"])["status"] == "active"
        assert api.trigger_schedule(created["id"])["kind"] == "manual"
        assert ScheduleFire.objects.count() == 2

        with pytest.raises(BadRequest) as refused:
            api.create_schedule(scheduled_plan(), name="x", interval="1m", timezone="Nowhere")
        assert refused.value.details[0]["code"] == "invalid_timezone"
        with pytest.raises(InvalidPlan):
            api.create_schedule({"name": "empty"}, name="x", cron="@daily")
        api.delete_schedule(created["id"])
        with pytest.raises(NotFound):
            api.get_schedule(created["id"])
