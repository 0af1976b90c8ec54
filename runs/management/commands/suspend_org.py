"""`python manage.py suspend_org ORGANIZATION [--reason TEXT]`: suspend an organization
(by name or id) through ``runs.people.suspension.organization_suspend``, as the admin's action
does: its keys answer 403 `organization_suspended`, its schedules skip, its webhooks hold
their deliveries, its running runs are paused (docs/tenants.md). Prints JSON."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from billing.selectors import organization_named
from runs.people.suspension import REASON_MAX_LENGTH, organization_suspend


class Command(BaseCommand):
    help = "Suspend an organization (by name or id) and pause its running runs; print JSON."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("organization", help="its name or id")
        parser.add_argument(
            "--reason", default="", help=f"why, for operators (at most {REASON_MAX_LENGTH})"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        wanted = options["organization"]
        organization = organization_named(wanted)
        if organization is None:
            raise CommandError(f"no organization named or with id {wanted.strip()!r}")
        done = organization_suspend(
            organization=organization, reason=options["reason"], actor="cli"
        )
        suspended = done.organization
        assert suspended.suspended_at is not None
        result = {
            "organization_id": str(suspended.pk),
            "name": suspended.name,
            "suspended_at": suspended.suspended_at.isoformat(),
            "reason": suspended.suspended_reason,
            "runs_paused": [str(run_id) for run_id in done.runs],
        }
        self.stdout.write(json.dumps(result))
