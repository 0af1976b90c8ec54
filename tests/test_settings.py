"""Settings: environment parsing, and production refusing to start misconfigured."""

from __future__ import annotations

import os
import runpy
import subprocess
import sys

import pytest

from config.env import REQUIRED, Env
from tests.support import ROOT

PRODUCTION_ENV = {
    "DJANGO_SETTINGS_MODULE": "config.settings.production",
    "SECRET_KEY": "k" * 20 + "production-secret-key-with-enough-entropy-9f8e7d6c5b4a",
    "ALLOWED_HOSTS": "orchestrator.example.com",
    "DATABASE_URL": "postgres://app:secret@db.internal:5432/orchestrator",
    "CELERY_BROKER_URL": "redis://redis.internal:6379/0",
    "FLOWER_BASIC_AUTH": "sre:a-long-flower-password",
    "SECRETS_ENCRYPTION_KEYS": "cHJvZHVjdGlvbi1zZWNyZXRzLWtleS0zMi1ieXRlcyE=",
}


def run_manage(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k not in PRODUCTION_ENV}
    clean.update(env)
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=clean,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_env_parses_types_and_collects_every_error() -> None:
    env = Env(
        environ={"A_BOOL": "yes", "A_INT": "12", "BAD_INT": "x", "A_LIST": "a, b,,c", "BAD": "2"}
    )
    assert env.boolean("A_BOOL") is True
    assert env.integer("A_INT", minimum=1) == 12
    assert env.integer("BAD_INT", 3) == 3
    assert env.strings("A_LIST") == ["a", "b", "c"]
    assert env.integer("BAD", 5, maximum=1) == 2
    assert env.string("MISSING", REQUIRED) == ""
    assert env.url("MISSING_URL", "mysql://x/y", schemes=("postgres",)) == "mysql://x/y"
    assert len(env.errors) == 4
    joined = "\n".join(env.errors)
    for name in ("BAD_INT", "BAD", "MISSING", "MISSING_URL"):
        assert name in joined


def test_production_settings_pass_check_deploy() -> None:
    result = run_manage(PRODUCTION_ENV, "check", "--deploy", "--fail-level", "WARNING")
    assert result.returncode == 0, result.stderr
    assert "System check identified no issues" in result.stdout


@pytest.mark.parametrize(
    "variable",
    [
        "SECRET_KEY",
        "ALLOWED_HOSTS",
        "DATABASE_URL",
        "CELERY_BROKER_URL",
        "FLOWER_BASIC_AUTH",
        "SECRETS_ENCRYPTION_KEYS",
    ],
)
def test_production_refuses_to_start_without_a_required_variable(variable: str) -> None:
    env = {k: v for k, v in PRODUCTION_ENV.items() if k != variable}

    result = run_manage(env, "check")

    assert result.returncode != 0
    assert f"{variable} is required but not set" in result.stderr


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("DATABASE_URL", "mysql://app@db/orchestrator"),
        ("CELERY_BROKER_URL", "amqp://guest@rabbit//"),
        ("SECRET_KEY", "short"),
        ("FLOWER_BASIC_AUTH", "no-colon"),
        ("CELERY_TASK_TIME_LIMIT", "soon"),
        ("HTTP_TOOL_ALLOWED_NETWORKS", "10.0.0.0/33"),
        ("SECRETS_ENCRYPTION_KEYS", "cHJvZHVjdGlvbi1zZWNyZXRzLWtleS0zMi1ieXRlcyE=,not-a-key"),
    ],
)
def test_production_refuses_a_malformed_variable_naming_it(variable: str, value: str) -> None:
    result = run_manage({**PRODUCTION_ENV, variable: value}, "check")

    assert result.returncode != 0
    assert variable in result.stderr
    assert "Invalid environment configuration" in result.stderr


@pytest.mark.django_db
def test_models_and_migrations_agree_and_system_checks_pass() -> None:
    from io import StringIO

    from django.core.management import call_command

    call_command("check", stdout=StringIO())
    call_command("makemigrations", "--check", "--dry-run", stdout=StringIO())


@pytest.mark.parametrize("module", ["config.settings.production", "config.settings.local"])
@pytest.mark.parametrize(
    ("env", "names"),
    [
        (
            {"ENGINE_HEARTBEAT_SECONDS": "60", "ENGINE_LEASE_SECONDS": "30"},
            ["ENGINE_HEARTBEAT_SECONDS", "ENGINE_LEASE_SECONDS", "shorter than"],
        ),
        (
            {"CELERY_VISIBILITY_TIMEOUT": "3000", "PLAN_MAX_STEP_TIMEOUT": "3600"},
            ["CELERY_VISIBILITY_TIMEOUT", "PLAN_MAX_STEP_TIMEOUT", "delivered again"],
        ),
        (
            # Enough for a doorbell's longest step, not for a pick-up that serves one.
            {"CELERY_VISIBILITY_TIMEOUT": "3700", "PLAN_MAX_STEP_TIMEOUT": "3600"},
            ["CELERY_VISIBILITY_TIMEOUT", "CELERY_TASK_TIME_LIMIT", "pick-up"],
        ),
        (
            {"RUNNER_HEARTBEAT_INTERVAL": "120", "RUNNER_STALE_AFTER": "120"},
            ["RUNNER_STALE_AFTER", "RUNNER_HEARTBEAT_INTERVAL", "stale"],
        ),
        ({"BILLING_LLM_ESTIMATE": "abc"}, ["BILLING_LLM_ESTIMATE", "'abc'"]),
        ({"BILLING_LLM_ESTIMATE": "NaN"}, ["BILLING_LLM_ESTIMATE", "finite"]),
        (
            {"BILLING_LLM_PRICE_PER_1K_TOKENS": "0.0000001"},
            ["BILLING_LLM_PRICE_PER_1K_TOKENS", "7 decimal places"],
        ),
        ({"BILLING_LLM_ESTIMATE": "1e20"}, ["BILLING_LLM_ESTIMATE", "too large", "'1e20'"]),
        (
            {"SCHEDULES_TICK_SECONDS": "60", "SCHEDULES_MISFIRE_GRACE": "60"},
            ["SCHEDULES_MISFIRE_GRACE", "SCHEDULES_TICK_SECONDS", "missed"],
        ),
        (
            {"WEBHOOK_TIMEOUT": "30", "WEBHOOK_LEASE": "20"},
            ["WEBHOOK_LEASE", "WEBHOOK_TIMEOUT", "longer than"],
        ),
        (
            # A batch's step waits under its claim's lease, not renewed.
            {"ENGINE_CLAIM_BATCH_HOLD_SECONDS": "40", "ENGINE_LEASE_SECONDS": "60"},
            ["ENGINE_CLAIM_BATCH_HOLD_SECONDS", "ENGINE_LEASE_SECONDS", "lose its lease"],
        ),
        (
            {"DATABASE_URL": "postgres://runs:a-password@127.0.0.1:5432/orchestrator"},
            ["DATABASE_URL", "'runs'", "billing, runs, webhooks", "search path"],
        ),
    ],
    ids=[
        "heartbeat-vs-lease",
        "visibility-vs-step",
        "visibility-vs-pick-up",
        "runner-stale-vs-heartbeat",
        "decimal",
        "nan",
        "too-precise",
        "too-large",
        "schedule-grace-vs-tick",
        "webhook-lease-vs-timeout",
        "batch-hold-vs-lease",
        "role-named-as-a-schema",
    ],
)
def test_a_bad_combination_refuses_to_start_naming_the_variables(
    module: str, env: dict[str, str], names: list[str]
) -> None:
    base = PRODUCTION_ENV if module.endswith("production") else {"DJANGO_SETTINGS_MODULE": module}
    result = run_manage({**base, **env}, "check")

    assert result.returncode != 0
    assert "Invalid environment configuration" in result.stderr
    for name in names:
        assert name in result.stderr


def test_the_default_settings_pass_the_cross_checks() -> None:
    result = run_manage({"DJANGO_SETTINGS_MODULE": "config.settings.local"}, "check")

    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"WEB_PORT": "8100", "PUBLIC_BASE_URL": ""}, "http://127.0.0.1:8100"),
        ({"WEB_PORT": "", "PUBLIC_BASE_URL": ""}, "http://127.0.0.1:8000"),
        (
            {"WEB_PORT": "8100", "PUBLIC_BASE_URL": "https://orch.example.com/"},
            "https://orch.example.com",
        ),
    ],
    ids=["web-port", "default", "set"],
)
def test_the_public_base_url_follows_the_web_port_unless_set(
    env: dict[str, str], expected: str
) -> None:
    """Callback URLs and webhook links name the web make run started, on its port."""
    result = run_manage(
        {"DJANGO_SETTINGS_MODULE": "config.settings.local", **env},
        "shell",
        "--verbosity=0",
        "-c",
        "from django.conf import settings; print(settings.PUBLIC_BASE_URL)",
    )

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == expected


def test_the_local_settings_log_text_at_warning_and_a_4xx_once() -> None:
    """manage.py in a developer's terminal (suspend_org printed a JSON INFO line on
    stderr beside its JSON) and make run's web (each 4xx printed twice, once by Django's
    own handler with DEBUG on)."""
    script = (
        "import logging; from django.test import Client; "
        "logging.getLogger('runs.people.suspension').info('organization suspended'); "
        "logging.getLogger('runs').warning('a warning'); "
        "print(Client(HTTP_HOST='localhost').get('/no-such-page').status_code)"
    )
    result = run_manage(
        {"DJANGO_SETTINGS_MODULE": "config.settings.local", "LOG_LEVEL": "", "LOG_FORMAT": ""},
        "shell",
        "--verbosity=0",
        "-c",
        script,
    )

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "404"
    assert "organization suspended" not in result.stderr
    assert " WARNING runs a warning" in result.stderr
    assert result.stderr.count("Not Found: /no-such-page") == 1, result.stderr


@pytest.mark.parametrize(
    ("level", "accesslog"),
    [("", "-"), ("INFO", "-"), ("debug", "-"), ("WARNING", None), ("ERROR", None)],
)
def test_gunicorns_access_log_is_written_only_where_the_level_lets_info_through(
    monkeypatch: pytest.MonkeyPatch, level: str, accesslog: str | None
) -> None:
    """Production's INFO keeps a line per request; make run's WARNING printed one too."""
    monkeypatch.setenv("LOG_LEVEL", level)

    loaded = runpy.run_path(str(ROOT / "config" / "gunicorn.py"))

    assert loaded["accesslog"] == accesslog
    assert loaded["loglevel"] == (level or "INFO")


def test_production_reaches_redis_through_sentinels_and_postgresql_at_several_hosts() -> None:
    env = {
        **PRODUCTION_ENV,
        "CELERY_BROKER_URL": "sentinel://s1.internal:26379/0;sentinel://s2.internal:26379/0",
        "REDIS_SENTINEL_MASTER": "orchestrator",
        "DATABASE_URL": "postgres://app:secret@db1.internal:5432,db2.internal:5432/orchestrator"
        "?target_session_attrs=read-write",
    }
    shown = (
        "from django.conf import settings as s; d = s.DATABASES['default'];"
        "print(s.CELERY_BROKER_TRANSPORT_OPTIONS['master_name'],"
        " s.CELERY_RESULT_BACKEND_TRANSPORT_OPTIONS['master_name'],"
        " d['HOST'], d['PORT'], d['OPTIONS']['target_session_attrs'])"
    )

    result = run_manage(env, "shell", "-c", shown)

    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1].split() == [
        "orchestrator",
        "orchestrator",
        "db1.internal,db2.internal",
        "5432,5432",
        "read-write",
    ]


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("CELERY_BROKER_URL", "sentinel://s1:26379/0;redis://r:6379/0", "not a sentinel://"),
        ("CELERY_BROKER_URL", "sentinel://:hunter2pw@s1:port/0", "sentinel://:***@s1:port/0"),
        ("DATABASE_URL", "postgres://app@db1:x,db2:5432/orchestrator", "is not a number"),
    ],
)
def test_production_refuses_a_malformed_store_url_saying_why(
    variable: str, value: str, message: str
) -> None:
    env = {**PRODUCTION_ENV, "CELERY_BROKER_URL": "sentinel://s1:26379/0", variable: value}

    result = run_manage(env, "check")

    assert result.returncode != 0
    assert message in result.stderr
    assert "hunter2pw" not in result.stderr  # never a password from a URL
