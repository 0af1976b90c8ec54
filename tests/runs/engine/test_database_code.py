"""The database's code (each app's sql/ folder) reaches every database the same way.

The files are installed whole, each app's into the schema named for it, after
migrations, whenever a checksum differs (``common.database_code``). A database created
now and one upgraded from a state earlier versions left (the engine's function and the
triggers in ``public``, installed by migrations; all of the code in the one schema
``engine``) end with the same schemas, functions, views and triggers, compared by their
definitions as PostgreSQL prints them.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.conf import settings
from django.db import connection

from common import database_code

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[3]

SCHEMAS = """
SELECT nspname, nspname FROM pg_namespace
WHERE nspname NOT LIKE 'pg\\_%' AND nspname <> 'information_schema' ORDER BY 1
"""
FUNCTIONS = """
SELECT n.nspname || '.' || p.proname || '(' || pg_get_function_identity_arguments(p.oid) || ')',
       pg_get_functiondef(p.oid)
FROM pg_proc AS p JOIN pg_namespace AS n ON n.oid = p.pronamespace
WHERE n.nspname NOT IN ('pg_catalog', 'information_schema') AND p.prokind = 'f'
ORDER BY 1
"""
VIEWS = """
SELECT schemaname || '.' || viewname, definition FROM pg_views
WHERE schemaname NOT IN ('pg_catalog', 'information_schema') ORDER BY 1
"""
TRIGGERS = """
SELECT tgrelid::regclass::text || ' ' || tgname, pg_get_triggerdef(oid)
FROM pg_trigger WHERE NOT tgisinternal ORDER BY 1
"""
# What earlier versions' migrations installed in `public` (the names the cleanup
# migrations look for; the bodies do not matter), and an `engine` schema of other files.
EARLIER = """
CREATE FUNCTION public.engine_step_completed(a_step bigint) RETURNS void
    LANGUAGE sql AS 'SELECT';
CREATE FUNCTION public.runs_forbid_event_change() RETURNS trigger
    LANGUAGE plpgsql AS 'BEGIN RAISE EXCEPTION ''append-only''; END';
CREATE TRIGGER runs_runevent_append_only BEFORE UPDATE OR DELETE ON runs_runevent
    FOR EACH ROW EXECUTE FUNCTION public.runs_forbid_event_change();
CREATE FUNCTION public.billing_forbid_ledger_change() RETURNS trigger
    LANGUAGE plpgsql AS 'BEGIN RAISE EXCEPTION ''append-only''; END';
CREATE TRIGGER billing_ledgerentry_append_only BEFORE UPDATE OR DELETE ON billing_ledgerentry
    FOR EACH ROW EXECUTE FUNCTION public.billing_forbid_ledger_change();
CREATE FUNCTION public.webhooks_tell_disabled(run_row runs_run, event text) RETURNS void
    LANGUAGE sql AS 'SELECT';
CREATE FUNCTION public.webhooks_run_event() RETURNS trigger
    LANGUAGE plpgsql AS 'BEGIN RETURN NULL; END';
CREATE TRIGGER webhooks_run_event AFTER UPDATE OF status ON runs_run
    FOR EACH ROW EXECUTE FUNCTION public.webhooks_run_event();
CREATE FUNCTION public.webhooks_escalation_event() RETURNS trigger
    LANGUAGE plpgsql AS 'BEGIN RETURN NULL; END';
CREATE TRIGGER webhooks_escalation_event AFTER INSERT ON runs_escalationticket
    FOR EACH ROW EXECUTE FUNCTION public.webhooks_escalation_event();
CREATE SCHEMA engine;
CREATE FUNCTION engine.step_completed(a_step bigint) RETURNS void LANGUAGE sql AS 'SELECT';
CREATE FUNCTION engine.retired() RETURNS void LANGUAGE sql AS 'SELECT';
CREATE TABLE engine.installed (file text PRIMARY KEY, checksum text NOT NULL,
                               installed_at timestamptz NOT NULL DEFAULT now());
INSERT INTO engine.installed (file, checksum) VALUES ('step_completed.sql', 'earlier');
"""


def definitions(conn: Any) -> dict[str, dict[str, str]]:
    with conn.cursor() as cursor:
        found = {}
        for name, query in (
            ("schemas", SCHEMAS),
            ("functions", FUNCTIONS),
            ("views", VIEWS),
            ("triggers", TRIGGERS),
        ):
            cursor.execute(query)
            found[name] = dict(cursor.fetchall())
        for schema in settings.DATABASE_CODE:
            cursor.execute(f"SELECT file, checksum FROM {schema}.installed ORDER BY file")  # noqa: S608
            found[f"{schema}.installed"] = dict(cursor.fetchall())
    return found


def in_one_schema(text: str, names: str) -> str:
    """A file's text as earlier versions installed it: its objects, and those of the
    other apps it names, in the schema ``engine``."""
    return re.sub(rf"\b(?:{'|'.join(settings.DATABASE_CODE)})\.({names})\b", r"engine.\1", text)


@pytest.fixture
def other_database() -> Iterator[str]:
    """The URL of a new, empty database beside the test database; dropped after."""
    name = f"{settings.DATABASES['default']['NAME']}_upgraded"
    url = os.environ["DATABASE_URL"].rsplit("/", 1)[0]
    with psycopg.connect(f"{url}/postgres", autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"{url}/{name}"
    finally:
        with psycopg.connect(f"{url}/postgres", autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def migrate(url: str, *target: str) -> None:
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--no-input", "-v0", *target],
        cwd=ROOT,
        env={**os.environ, "DATABASE_URL": url},
        check=True,
    )


def test_the_database_holds_the_code_of_the_files_each_apps_in_its_schema() -> None:
    assert database_code.current(connection)
    installed = database_code.installed(connection)
    assert list(installed) == ["billing", "runs", "webhooks"]
    for schema, folder in database_code.folders().items():
        assert folder == ROOT / schema / "sql"
        assert set(installed[schema]) == {path.name for path in folder.glob("*.sql")}


def test_an_upgraded_database_ends_with_the_code_of_a_fresh_one(other_database: str) -> None:
    # The tables as they stood when the code lived in migrations: the code is not
    # installed while migrations are left to apply.
    for app, last in (("billing", "0010"), ("runs", "0021"), ("webhooks", "0001")):
        migrate(other_database, app, last)
    with psycopg.connect(other_database, autocommit=True) as upgraded:
        assert upgraded.execute("SELECT to_regnamespace('engine')").fetchone() == (None,)
        upgraded.execute(EARLIER)

    migrate(other_database)

    with psycopg.connect(other_database) as upgraded:
        assert definitions(upgraded) == definitions(connection.connection)


def test_a_database_with_all_the_code_in_the_schema_engine_ends_with_the_schemas_of_a_fresh_one(
    other_database: str,
) -> None:
    migrate(other_database)
    # The code as earlier versions installed it, at the latest tables: every file in the
    # one schema `engine`, its triggers on the tables calling it there, and its checksums.
    sources = database_code.sources()
    names = "|".join(
        name
        for files in sources.values()
        for text in files.values()
        for name in re.findall(r"CREATE (?:FUNCTION|VIEW) \w+\.(\w+)", text)
    )
    with psycopg.connect(other_database, autocommit=True) as upgraded, upgraded.transaction():
        for schema in settings.DATABASE_CODE:
            upgraded.execute(f"DROP SCHEMA {schema} CASCADE")
        upgraded.execute("CREATE SCHEMA engine")
        for files in sources.values():
            for text in files.values():
                upgraded.execute(in_one_schema(text, names))
        upgraded.execute(
            "CREATE TABLE engine.installed (file text PRIMARY KEY, checksum text NOT NULL, "
            "installed_at timestamptz NOT NULL DEFAULT now())"
        )
        for checksums in database_code.checksums().values():
            for file, checksum in checksums.items():
                upgraded.execute(
                    "INSERT INTO engine.installed VALUES (%s, %s) ON CONFLICT DO NOTHING",
                    [file, checksum],
                )
        trigger = "SELECT tgfoid::regproc::text FROM pg_trigger WHERE tgname = %s"
        assert upgraded.execute(trigger, ["runs_runevent_append_only"]).fetchone() == (
            "engine.refuse_change",
        )

    migrate(other_database)  # nothing left to migrate: the code alone is installed

    with psycopg.connect(other_database) as upgraded:
        assert upgraded.execute("SELECT to_regnamespace('engine')").fetchone() == (None,)
        assert definitions(upgraded) == definitions(connection.connection)


def test_a_way_back_before_the_schemas_per_app_leaves_no_code_for_the_earlier_one_to_meet(
    other_database: str,
) -> None:
    migrate(other_database)

    migrate(other_database, "runs", "0031")

    with psycopg.connect(other_database) as back:
        assert [name for name, _ in back.execute(SCHEMAS)] == ["public"]
        assert back.execute(TRIGGERS).fetchall() == []
