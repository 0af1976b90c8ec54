"""`python manage.py unsuspend_org ORGANIZATION`: lift an organization's suspension (by
name or id) through ``runs.people.suspension.organization_unsuspend``, as the admin's action
does, and resume the runs the suspension paused, only those (docs/tenants.md). Prints
JSON."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from billing.selectors import organization_named
from runs.people.suspension import organization_unsuspend


class Command(BaseCommand):
    help = "Unsuspend an organization (by name or id), resume the runs its suspension paused."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("organization", help="its name or id")

    def handle(self, *args: Any, **options: Any) -> None:
        wanted = options["organization"]
        organization = organization_named(wanted)
        if organization is None:
            raise CommandError(f"no organization named or with id {wanted.strip()!r}")
        done = organization_unsuspend(organization=organization, actor="cli")
        result = {
            "organization_id": str(done.organization.pk),
            "name": done.organization.name,
            "runs_resumed": [str(run_id) for run_id in done.runs],
        }
        self.stdout.write(json.dumps(result))
