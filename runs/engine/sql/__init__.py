"""The database's code: every PostgreSQL function and trigger, once, in this folder.

Each ``.sql`` file holds one rule under its own name (``step_completed.sql`` defines
``engine.step_completed``): the engine's recording of a step and its shapes, the claim,
the fair choice, the start, the credits' reserve, charge and settle, the webhook
deliveries' trigger, the append-only guards. They compose by calling each other, never by
text assembled in Python, and Python calls them (``SELECT * FROM engine.step_claim(...)``)
and decodes their rows.

How they reach a database (docs/engine.md, "Database code"): they are repeatable, in the
manner of Flyway's repeatable migrations, not versioned. After ``manage.py migrate`` has
brought the tables up to date (``runs.apps``: Django's ``post_migrate``), ``install``
compares each file's checksum with those recorded in ``engine.installed``; when any
differs (a file changed, was added or removed), the schema ``engine`` is dropped and
made again from the files, all in one transaction. So a fresh database and an upgraded
one end with the same functions, and a change to a function is a change to its file,
with no migration of its own (``tests/runs/engine/test_database_code.py`` compares the
two).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from django.db import connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.migrations.executor import MigrationExecutor

FOLDER = Path(__file__).parent
SCHEMA = "engine"
# One installer at a time (two `migrate` at once on a deploy): its own advisory lock.
_INSTALL_LOCK = 0x656E_6769  # "engi"


def sources() -> dict[str, str]:
    """Every file's text, by file name, in name order: the order they are applied in.
    Any order works: a PL/pgSQL body's statements are parsed when it is defined but
    resolved when called, and the few SQL-language functions call no other function."""
    return {path.name: path.read_text() for path in sorted(FOLDER.glob("*.sql"))}


def checksums() -> dict[str, str]:
    return {name: hashlib.sha256(text.encode()).hexdigest() for name, text in sources().items()}


def installed(connection: BaseDatabaseWrapper) -> dict[str, str]:
    """The checksums recorded by the last install (none: never installed)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT to_regclass('engine.installed') IS NOT NULL")
        if not cursor.fetchone()[0]:
            return {}
        cursor.execute("SELECT file, checksum FROM engine.installed")
        return dict(cursor.fetchall())


def current(connection: BaseDatabaseWrapper) -> bool:
    """Whether the database holds exactly the code of these files."""
    return installed(connection) == checksums()


def install(connection: BaseDatabaseWrapper, *, force: bool = False) -> bool:
    """Make the schema ``engine`` again from the files, unless it is current already
    (``force``: whatever it holds); returns whether it did. In one transaction: a
    session calling the functions meanwhile sees the old ones or the new ones, never a
    part of each."""
    wanted = checksums()
    with transaction.atomic(using=connection.alias), connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [_INSTALL_LOCK])
        if not force and installed(connection) == wanted:
            return False
        cursor.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
        cursor.execute(f"CREATE SCHEMA {SCHEMA}")
        for text in sources().values():
            cursor.execute(text)
        cursor.execute(
            "CREATE TABLE engine.installed (file text PRIMARY KEY, checksum text NOT NULL, "
            "installed_at timestamptz NOT NULL DEFAULT now())"
        )
        cursor.executemany(
            "INSERT INTO engine.installed (file, checksum) VALUES (%s, %s)", list(wanted.items())
        )
    return True


def install_after_migrate(using: str = "default", **kwargs: object) -> None:
    """``post_migrate``: install the files once every migration is applied (a migrate to
    an earlier state leaves the engine as it is: the files are written for the latest
    tables)."""
    connection = connections[using]
    if current(connection):
        return
    executor = MigrationExecutor(connection)
    if executor.migration_plan(executor.loader.graph.leaf_nodes()):
        return
    install(connection)
