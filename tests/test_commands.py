"""Management commands: create_org, set_limits, check_invariants and prepare."""

from __future__ import annotations

import json
import os
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from cryptography.fernet import Fernet
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.db import connection

from billing.models import Organization
from billing.secrets import secret_put, secret_values
from billing.services import api_key_authenticate
from runs import services
from runs.engine.start import run_start
from tests import factories

pytestmark = pytest.mark.django_db


def test_create_org_prints_the_organization_and_a_working_key() -> None:
    out = StringIO()

    call_command("create_org", "Acme Research", stdout=out)

    result = json.loads(out.getvalue())
    organization = Organization.objects.get(pk=result["organization_id"])
    assert organization.name == "Acme Research"
    key = api_key_authenticate(result["api_key"])
    assert key is not None
    assert key.organization == organization


def test_create_org_refuses_a_duplicate_name() -> None:
    call_command("create_org", "Acme", stdout=StringIO())

    with pytest.raises(CommandError, match="already exists"):
        call_command("create_org", "Acme", stdout=StringIO())

    assert Organization.objects.filter(name="Acme").count() == 1


def test_check_invariants_passes_on_a_consistent_database() -> None:
    run = factories.run(agents=2)
    run_start(run_id=run.pk)
    services.run_pick_up(run_id=run.pk)
    out = StringIO()

    call_command("check_invariants", stdout=out)

    assert "invariants hold" in out.getvalue()


def test_check_invariants_lists_each_violation_and_fails() -> None:
    run = factories.run(agents=2)
    run_start(run_id=run.pk)
    services.run_pick_up(run_id=run.pk)
    with connection.cursor() as cursor:  # corrupt it behind the services' back
        cursor.execute("UPDATE runs_run SET agent_count = 5 WHERE id = %s", [run.pk])
        cursor.execute("UPDATE runs_agent SET status = 'completed' WHERE run_id = %s", [run.pk])
    out = StringIO()

    with pytest.raises(CommandError, match="invariants violated"):
        call_command("check_invariants", stdout=out)

    report = out.getvalue()
    assert f"run {run.pk}: agent_count 5 but 2 agents" in report
    assert f"run {run.pk}: running but no agent is pending or running" in report


def test_create_org_grants_initial_credits() -> None:
    out = StringIO()

    call_command("create_org", "Funded", "--credits", "250.5", stdout=out)

    organization = Organization.objects.get(pk=json.loads(out.getvalue())["organization_id"])
    assert str(organization.credits_available) == "250.500000"
    assert organization.ledger_entries.get().type == "grant"


def test_create_org_refuses_bad_credits() -> None:
    with pytest.raises(CommandError, match="--credits"):
        call_command("create_org", "Broke", "--credits", "lots", stdout=StringIO())
    assert not Organization.objects.filter(name="Broke").exists()


def test_setup_periodic_tasks_installs_every_schedule_once_and_removes_stale_ones() -> None:
    from django_celery_beat.models import IntervalSchedule, PeriodicTask

    from orchestrator.periodic import PERIODIC_PREFIX, periodic_tasks

    stale_interval = IntervalSchedule.objects.create(every=99, period="seconds")
    PeriodicTask.objects.create(
        name=f"{PERIODIC_PREFIX}retired-sweep", task="x", interval=stale_interval
    )
    PeriodicTask.objects.create(name="added by hand", task="y", interval=stale_interval)

    call_command("setup_periodic_tasks", stdout=StringIO())
    call_command("setup_periodic_tasks", stdout=StringIO())  # twice: nothing doubles

    installed = PeriodicTask.objects.filter(name__startswith=PERIODIC_PREFIX)
    declared = sorted(periodic.task for periodic in periodic_tasks())
    assert sorted(installed.values_list("task", flat=True)) == declared
    assert {t.queue for t in installed} == {"sweeps", "webhooks"}
    assert all(t.enabled and t.expire_seconds for t in installed)
    assert PeriodicTask.objects.filter(name="added by hand").exists()


def test_create_org_issues_a_full_key() -> None:
    out = StringIO()
    call_command("create_org", "Full Co", stdout=out)

    result = json.loads(out.getvalue())
    assert result["scope"] == "full"
    assert api_key_authenticate(result["api_key"]).scope == "full"


@pytest.mark.parametrize("scope", ["read", "full", "runner"])
def test_create_api_key_prints_one_json_line_with_a_key_of_that_scope(scope: str) -> None:
    call_command("create_org", "Scoped", stdout=StringIO())
    out = StringIO()

    call_command("create_api_key", "Scoped", "--scope", scope, "--name", "dash", stdout=out)

    lines = out.getvalue().strip().splitlines()
    assert len(lines) == 1
    result = json.loads(lines[0])
    assert (result["name"], result["scope"], result["key_name"]) == ("Scoped", scope, "dash")
    key = api_key_authenticate(result["api_key"])
    assert key is not None
    assert (key.scope, key.organization.name, key.prefix) == (
        scope,
        "Scoped",
        result["api_key_prefix"],
    )


def test_create_api_key_refuses_an_unknown_scope_and_creates_nothing() -> None:
    call_command("create_org", "Strict", stdout=StringIO())
    organization = Organization.objects.get(name="Strict")
    keys_before = organization.api_keys.count()

    with pytest.raises(CommandError, match="unknown scope 'admin'"):
        call_command("create_api_key", "Strict", "--scope", "admin", stdout=StringIO())

    assert organization.api_keys.count() == keys_before


def test_create_api_key_refuses_an_unknown_organization() -> None:
    with pytest.raises(CommandError, match="no organization named"):
        call_command("create_api_key", "Nobody", stdout=StringIO())


def test_rotate_secrets_moves_every_secret_to_the_first_key(settings: Any) -> None:
    old, new = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    organization = factories.org()
    settings.SECRETS_ENCRYPTION_KEYS = [old]
    secret_put(organization=organization, name="TOKEN", value="s3cr3t")
    settings.SECRETS_ENCRYPTION_KEYS = [new, old]
    out = StringIO()

    call_command("rotate_secrets", stdout=out)

    assert json.loads(out.getvalue()) == {"rotated": 1}
    settings.SECRETS_ENCRYPTION_KEYS = [new]
    assert secret_values(organization_id=organization.pk, names=["TOKEN"]) == {"TOKEN": "s3cr3t"}


def test_rotate_secrets_names_a_secret_no_key_decrypts_without_its_value(settings: Any) -> None:
    organization = factories.org()
    settings.SECRETS_ENCRYPTION_KEYS = [Fernet.generate_key().decode()]
    secret_put(organization=organization, name="LOST", value="s3cr3t")
    settings.SECRETS_ENCRYPTION_KEYS = [Fernet.generate_key().decode()]

    with pytest.raises(CommandError, match="LOST") as caught:
        call_command("rotate_secrets", stdout=StringIO())

    assert "s3cr3t" not in str(caught.value)


def test_set_limits_sets_them_through_the_service_and_prints_them() -> None:
    organization = factories.org(name="limited")
    out = StringIO()
    call_command("set_limits", "limited", "--max-running-runs", "3", "--share", "2", stdout=out)
    printed = json.loads(out.getvalue())
    assert printed["max_running_runs"] == 3
    assert printed["share"] == 2
    organization.refresh_from_db()
    assert (organization.max_running_runs, organization.share) == (3, 2)

    call_command("set_limits", str(organization.pk), "--max-running-runs", "default", stdout=out)
    organization.refresh_from_db()
    assert organization.max_running_runs is None


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["nobody", "--share", "2"], "no organization named or with id 'nobody'"),
        (["limited", "--max-running-runs", "two"], "--max-running-runs: not a whole number"),
        (["limited", "--max-pending-runs", "0"], "max_pending_runs must be a whole number"),
        (["limited", "--share", "default"], "--share: not a whole number"),
    ],
)
def test_set_limits_refuses_bad_input_and_changes_nothing(
    arguments: list[str], message: str
) -> None:
    organization = factories.org(name="limited")
    with pytest.raises(CommandError, match=message):
        call_command("set_limits", *arguments, stdout=StringIO())
    organization.refresh_from_db()
    assert (organization.max_running_runs, organization.max_pending_runs) == (None, None)


# --------------------------------------------------------------------------- prepare
@pytest.fixture
def static_sources(settings: Any, tmp_path: Path) -> Path:
    """Static files from one folder of ours only, collected into another (the apps'
    thousand files would make each collection cost seconds)."""
    sources = tmp_path / "sources"
    sources.mkdir()
    (sources / "site.css").write_text("body { color: black; }")
    settings.STATICFILES_DIRS = [str(sources)]
    settings.STATICFILES_FINDERS = ["django.contrib.staticfiles.finders.FileSystemFinder"]
    settings.STATIC_ROOT = str(tmp_path / "static")
    settings.STORAGES = {
        **settings.STORAGES,
        "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.ManifestStaticFilesStorage"},
    }
    return sources


def prepare(password_file: Path) -> str:
    out = StringIO()
    call_command("prepare", "--admin-password-file", str(password_file), stdout=out)
    return out.getvalue()


def test_prepare_collects_static_files_again_only_when_one_changed(
    static_sources: Path, tmp_path: Path
) -> None:
    password = tmp_path / "admin-password"
    password.write_text("a-long-admin-password\n")

    first = prepare(password)
    second = prepare(password)
    source = static_sources / "site.css"
    source.write_text("body { color: navy; }")
    os.utime(source, ns=(source.stat().st_atime_ns, source.stat().st_mtime_ns + 1_000_000))
    third = prepare(password)

    assert "migrations: none applied" in first
    assert "static files: collected" in first
    assert "static files: unchanged" in second
    assert "static files: collected" in third
    manifest = json.loads((tmp_path / "static" / "staticfiles.json").read_text())
    assert "site.css" in manifest["paths"]


def test_prepare_collects_again_when_the_manifest_is_gone(
    static_sources: Path, tmp_path: Path
) -> None:
    password = tmp_path / "admin-password"
    password.write_text("a-long-admin-password\n")
    prepare(password)

    (tmp_path / "static" / "staticfiles.json").unlink()

    assert "static files: collected" in prepare(password)


def test_prepare_sets_the_admin_password_once_and_again_when_it_changed(
    static_sources: Path, tmp_path: Path
) -> None:
    password = tmp_path / "admin-password"
    password.write_text("a-long-admin-password\n")

    created = prepare(password)
    unchanged = prepare(password)
    admin = get_user_model().objects.get(username="admin")
    admin.set_password("changed-in-the-admin")
    admin.save()
    reset = prepare(password)
    password.write_text("another-long-password\n")
    new_password = prepare(password)

    assert "admin user 'admin' created" in created
    assert "admin user 'admin' unchanged" in unchanged
    assert "admin user 'admin' updated" in reset
    assert "admin user 'admin' updated" in new_password
    admin.refresh_from_db()
    assert admin.is_superuser
    assert admin.is_staff
    assert admin.check_password("another-long-password")


def test_prepare_sets_an_admin_password_that_begins_with_a_dash(
    static_sources: Path, tmp_path: Path
) -> None:
    """make run's earlier passwords (token_urlsafe) began with `-` one time in 64: handed on
    as `--password -AiPQ...`, argparse read it as an option and the start stopped."""
    password = tmp_path / "admin-password"
    password.write_text("-AiPQP6M5sQWpMQU\n")

    said = prepare(password)

    assert "admin user 'admin' created" in said
    assert get_user_model().objects.get(username="admin").check_password("-AiPQP6M5sQWpMQU")
