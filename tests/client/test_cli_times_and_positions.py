"""What ``orch`` says of where and when, run in this process (the checkout's code, not
the installed script) against the live server: a plan file's parse error at the file's
own line and column, and a schedule's times in its zone, named, with no next due time
while paused."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from orchestrator_client import Client
from orchestrator_client.cli import app
from tests.schedules.conftest import scheduled_plan
from tests.tenants import LiveTenant

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

Orch = Callable[..., Any]


@pytest.fixture
def orch(tenant: LiveTenant, tmp_path: Path) -> Orch:
    """``orch ARGS`` in this process, configured for ``tenant`` by the environment."""
    runner = CliRunner()
    env = {
        "ORCH_URL": tenant.url,
        "ORCH_API_KEY": tenant.key,
        "HOME": str(tmp_path),
        "XDG_CONFIG_HOME": str(tmp_path / ".config"),
    }

    def run(*args: str) -> Any:
        return runner.invoke(app, list(args), env=env, catch_exceptions=False)

    return run


def test_a_yaml_error_is_reported_at_the_files_own_line_and_column(
    orch: Orch, tmp_path: Path
) -> None:
    plan = tmp_path / "broken.yaml"
    plan.write_text("name: broken\nagents: : :\n")  # two lines; the second is wrong at 9

    submitted = orch("runs", "submit", str(plan))
    scheduled = orch("schedules", "create", str(plan), "--cron", "0 * * * *")

    for result in (submitted, scheduled):
        assert result.exit_code == 1, result.output
        assert "invalid_yaml" in result.stderr
        assert "in the plan, line 2, column 9:" in result.stderr
        assert "    agents: : :\n" in result.stderr
        assert "line 3," not in result.stderr
        assert "line 5," not in result.stderr


def test_a_json_error_is_reported_at_the_files_own_line_and_column(
    orch: Orch, tmp_path: Path
) -> None:
    plan = tmp_path / "broken.json"
    plan.write_text('{"name": "broken" "agents": []}\n')

    result = orch("runs", "submit", str(plan))

    assert result.exit_code == 1, result.output
    assert "invalid_json" in result.stderr
    assert "line 1 column 19 (char 18)" in result.stderr


def test_a_schedule_shows_its_times_in_its_zone_and_no_next_due_time_while_paused(
    orch: Orch, tenant: LiveTenant
) -> None:
    with Client(tenant.url, tenant.key, timeout=10) as api:
        created = api.create_schedule(
            scheduled_plan(), name="nightly", cron="30 1 * * *", timezone="Europe/Paris"
        )
    schedule_id = created["id"]
    in_paris = r"\d{4}-\d\d-\d\d 01:30:00 Europe/Paris"

    shown = orch("schedules", "show", schedule_id)
    listed = orch("schedules", "ls")
    paused = orch("schedules", "pause", schedule_id)
    shown_paused = orch("schedules", "show", schedule_id)
    listed_paused = orch("schedules", "ls")

    assert shown.exit_code == 0, shown.output
    assert re.search(rf"^next due  {in_paris}$", shown.stdout, re.MULTILINE), shown.stdout
    row = next(line for line in listed.stdout.splitlines() if schedule_id in line)
    assert re.search(r"\d{4}-\d\d-\d\d 01:30 +Europe/Paris", row), row
    assert paused.stdout.strip() == f"schedule {schedule_id}: paused"
    assert "next due  paused" in shown_paused.stdout
    row = next(line for line in listed_paused.stdout.splitlines() if schedule_id in line)
    assert "paused" in row
    assert "01:30" not in row


def test_a_schedule_created_from_the_command_line_says_when_it_is_next_due(
    orch: Orch, tmp_path: Path
) -> None:
    plan = tmp_path / "report.yaml"
    plan.write_text(yaml.safe_dump(scheduled_plan()))

    created = orch(
        "schedules", "create", str(plan), "--cron", "30 1 * * *", "--timezone", "Asia/Tokyo"
    )

    assert created.exit_code == 0, created.output
    assert re.search(r"^next due  \d{4}-\d\d-\d\d 01:30:00 Asia/Tokyo$", created.stdout, re.M)
