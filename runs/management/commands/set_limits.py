"""`python manage.py set_limits ORGANIZATION [--max-running-runs N] [--max-running-steps N]
[--max-pending-runs N] [--share N]`: an organization's limits (docs/fairness.md), through
``runs.admission.limits_set`` as the admin sets them; `default` puts one back to its
setting. Prints the limits in force as JSON."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from billing.selectors import organization_named
from runs import admission

DEFAULT = "default"


class Command(BaseCommand):
    help = "Set an organization's limits (by name or id); print the limits in force as JSON."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("organization", help="its name or id")
        for name in admission.LIMIT_FIELDS:
            parser.add_argument(
                f"--{name.replace('_', '-')}",
                dest=name,
                help=f"a whole number >= 1{'' if name == 'share' else ', or default'}",
            )

    def handle(self, *args: Any, **options: Any) -> None:
        wanted = options["organization"].strip()
        found = organization_named(wanted)
        if found is None:
            raise CommandError(f"no organization named or with id {wanted!r}")
        limits: dict[str, int | None] = {}
        for name in admission.LIMIT_FIELDS:
            value = options.get(name)
            if value is None:
                continue
            if value == DEFAULT and name != "share":
                limits[name] = None
                continue
            try:
                limits[name] = int(value)
            except ValueError:
                raise CommandError(
                    f"--{name.replace('_', '-')}: not a whole number: {value!r}"
                ) from None
        try:
            applied = admission.limits_set(found.pk, actor="cli", **limits)
        except admission.InvalidLimits as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(json.dumps({"organization_id": str(found.pk), **asdict(applied)}))
