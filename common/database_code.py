"""The database's code: every PostgreSQL function, view and trigger, once, in the ``sql/``
folder of the app that owns it, installed in the schema named for that app.

Each ``.sql`` file holds one rule under its own name (``runs/sql/step_completed.sql``
defines ``runs.step_completed``, ``billing/sql/credits_reserve.sql``
``billing.credits_reserve``): the engine's recording of a step and its shapes, the claim,
the fair choice and the start in ``runs``; the credits' reserve, charge and settle, the
ledger and its append-only guard in ``billing``; the deliveries' triggers and claim in
``webhooks``. They compose by calling each other, never by text assembled in Python, and
Python calls them (``SELECT * FROM runs.step_claim(...)``) and decodes their rows.

How they reach a database (docs/engine.md, "Database code"): they are repeatable, in the
manner of Flyway's repeatable migrations, not versioned. After ``manage.py migrate`` has
brought the tables up to date (Django's ``post_migrate``, connected by ``runs.apps``),
``install`` compares each file's checksum with those recorded in its schema's
``installed`` table; when any differs (a file changed, was added or removed), every
schema of ``settings.DATABASE_CODE`` is dropped and made again from the files, all in one
transaction, and the schema ``engine`` that earlier versions kept all of it in is
dropped with them. So a fresh database and an upgraded one end with the same code, and a
change to a function is a change to its file, with no migration of its own
(``tests/runs/engine/test_database_code.py`` compares the two).

All the schemas are made again together, never one alone: an app's code may call the
code of the apps below it (a run's recording charges by ``billing.credits_charge``, the
run events' trigger runs ``billing.refuse_change``), and a schema dropped alone would
take those callers' triggers with it. The apps are installed in the order
``settings.DATABASE_CODE`` lists them, the lowest layer first, so what a file's triggers
and views name exists when it is applied.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from django.apps import apps
from django.conf import settings
from django.db import connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.migrations.executor import MigrationExecutor

# Where earlier versions installed all of the code: dropped by every install.
RETIRED = ("engine",)
# One installer at a time (two `migrate` at once on a deploy): its own advisory lock, the
# key earlier versions took too, so an old and a new installer never run at once.
_INSTALL_LOCK = 0x656E_6769


def folders() -> dict[str, Path]:
    """Each schema's folder, in the order they are installed: ``settings.DATABASE_CODE``'s
    apps, each its ``sql/`` folder, in the schema named for the app."""
    return {
        label: Path(apps.get_app_config(label).path) / "sql" for label in settings.DATABASE_CODE
    }


def sources() -> dict[str, dict[str, str]]:
    """Every file's text, by schema and file name, in the order they are applied: a
    schema's files in name order. Any order works within a schema (a PL/pgSQL body's
    statements are parsed when it is defined but resolved when called, and a file's
    triggers and views name only what it defines or a lower schema does)."""
    return {
        schema: {path.name: path.read_text() for path in sorted(folder.glob("*.sql"))}
        for schema, folder in folders().items()
    }


def checksums() -> dict[str, dict[str, str]]:
    return {
        schema: {name: hashlib.sha256(text.encode()).hexdigest() for name, text in files.items()}
        for schema, files in sources().items()
    }


def installed(connection: BaseDatabaseWrapper) -> dict[str, dict[str, str]]:
    """The checksums recorded by the last install, by schema (a schema never installed
    is absent); a retired schema still there is listed with what it recorded, so that it
    is never current."""
    found: dict[str, dict[str, str]] = {}
    with connection.cursor() as cursor:
        for schema in (*RETIRED, *settings.DATABASE_CODE):
            cursor.execute("SELECT to_regnamespace(%s) IS NOT NULL", [schema])
            if not cursor.fetchone()[0]:
                continue
            cursor.execute("SELECT to_regclass(%s) IS NOT NULL", [f"{schema}.installed"])
            if not cursor.fetchone()[0]:
                found[schema] = {}
                continue
            # A schema named by the settings (an app's label), no input.
            cursor.execute(f"SELECT file, checksum FROM {schema}.installed")  # noqa: S608
            found[schema] = dict(cursor.fetchall())
    return found


def current(connection: BaseDatabaseWrapper) -> bool:
    """Whether the database holds exactly the code of the files, and nothing retired."""
    return installed(connection) == checksums()


def install(connection: BaseDatabaseWrapper, *, force: bool = False) -> bool:
    """Make every schema again from the files, unless they are current already
    (``force``: whatever they hold); returns whether it did. In one transaction: a
    session calling the functions meanwhile sees the old ones or the new ones, never a
    part of each."""
    wanted = checksums()
    with transaction.atomic(using=connection.alias), connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [_INSTALL_LOCK])
        if not force and installed(connection) == wanted:
            return False
        for schema in (*RETIRED, *reversed(settings.DATABASE_CODE)):
            cursor.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        for schema, files in sources().items():
            cursor.execute(f"CREATE SCHEMA {schema}")
            for text in files.values():
                cursor.execute(text)
            cursor.execute(
                f"CREATE TABLE {schema}.installed (file text PRIMARY KEY, checksum text NOT NULL, "
                "installed_at timestamptz NOT NULL DEFAULT now())"
            )
            cursor.executemany(
                f"INSERT INTO {schema}.installed (file, checksum) VALUES (%s, %s)",  # noqa: S608
                list(wanted[schema].items()),
            )
    return True


def install_after_migrate(using: str = "default", **kwargs: object) -> None:
    """``post_migrate``: install the files once every migration is applied (a migrate to
    an earlier state leaves the code as it is: the files are written for the latest
    tables)."""
    connection = connections[using]
    if current(connection):
        return
    executor = MigrationExecutor(connection)
    if executor.migration_plan(executor.loader.graph.leaf_nodes()):
        return
    install(connection)
