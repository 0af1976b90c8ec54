"""`python manage.py prepare`: what `make run` does before it starts the processes, in one
process: each `manage.py` pays Django's start-up (3 to 4 s on 2 cores), and a restart of
`make run` with nothing changed should not pay it four times.

- the migrations (`migrate`);
- the static files (`collectstatic`), skipped when no source file changed since the
  last collection: a fingerprint of every file the finders list (path, size, mtime) is
  kept beside the collected files;
- the periodic tasks (`setup_periodic_tasks`);
- the superuser (`ensure_admin`), its password read from a file; not hashed again when
  neither the file nor the user changed since the last time (a stamp beside the file).
"""

from __future__ import annotations

import hashlib
import os
from io import StringIO
from pathlib import Path
from typing import Any

from django.apps import apps
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.staticfiles.finders import get_finders
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

FINGERPRINT = ".fingerprint"


def static_fingerprint() -> str:
    """Every static source file's path, size and modification time, and the storage that
    collects them: what collectstatic's result depends on."""
    ignore = apps.get_app_config("staticfiles").ignore_patterns  # type: ignore[attr-defined]
    found = []
    for finder in get_finders():
        for path, storage in finder.list(ignore):
            stat = os.stat(storage.path(path))
            prefix = getattr(storage, "prefix", None) or ""
            found.append(f"{prefix}/{path}\0{stat.st_size}\0{stat.st_mtime_ns}")
    digest = hashlib.sha256(f"{settings.STORAGES['staticfiles']}\0{settings.STATIC_URL}".encode())
    for line in sorted(found):
        digest.update(line.encode() + b"\n")
    return digest.hexdigest()


class Command(BaseCommand):
    help = (
        "Migrate, collect the static files (unless unchanged), install the periodic tasks "
        "and ensure the superuser, in one process: what make run does before it starts."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--admin-username", default="admin")
        parser.add_argument(
            "--admin-password-file",
            type=Path,
            required=True,
            help="the superuser's password (a stamp beside it records what was set)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        self.migrate()
        self.collect_static()
        periodic = StringIO()
        call_command("setup_periodic_tasks", stdout=periodic)
        self.stdout.write(periodic.getvalue().strip())
        self.ensure_admin(options["admin_username"], options["admin_password_file"])

    def migrate(self) -> None:
        executor = MigrationExecutor(connection)
        pending = executor.migration_plan(executor.loader.graph.leaf_nodes())
        if pending:
            call_command("migrate", interactive=False, verbosity=0)
        self.stdout.write(f"migrations: {len(pending) or 'none'} applied")

    def collect_static(self) -> None:
        root = Path(settings.STATIC_ROOT)
        stamp = root / FINGERPRINT
        fingerprint = static_fingerprint()
        # A manifest storage answers nothing without its manifest, whatever the stamp says.
        manifest = root / "staticfiles.json"
        needs_manifest = "Manifest" in str(settings.STORAGES["staticfiles"]["BACKEND"])
        if (
            stamp.is_file()
            and stamp.read_text() == fingerprint
            and (manifest.is_file() or not needs_manifest)
        ):
            self.stdout.write("static files: unchanged")
            return
        call_command("collectstatic", interactive=False, verbosity=0)
        stamp.write_text(fingerprint)
        self.stdout.write("static files: collected")

    def ensure_admin(self, username: str, password_file: Path) -> None:
        try:
            password = password_file.read_text().strip()
        except OSError as problem:
            raise CommandError(f"cannot read the admin password: {problem}") from problem
        # Hashing a password costs most of a second on purpose: skip it when the stamp
        # shows this password set and the user's hash untouched since (a password
        # changed in the admin is a new hash, and is reset as before).
        stamp = password_file.with_name(password_file.name + ".set")
        wanted = hashlib.sha256(password.encode()).hexdigest()
        user = get_user_model().objects.filter(username=username).first()
        if (
            user is not None
            and user.is_staff
            and user.is_superuser
            and stamp.is_file()
            and stamp.read_text() == f"{wanted} {user.password}"
        ):
            self.stdout.write(f"admin user {username!r} unchanged")
            return
        said = StringIO()
        # `--password=VALUE`, one argument: given as a keyword, call_command hands argparse
        # `--password VALUE`, and a password beginning with `-` reads as an option.
        call_command(
            "ensure_admin", f"--username={username}", f"--password={password}", stdout=said
        )
        user = get_user_model().objects.get(username=username)
        stamp.write_text(f"{wanted} {user.password}")
        self.stdout.write(said.getvalue().strip())
