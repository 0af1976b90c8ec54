"""`python manage.py set_limits ORGANIZATION [--max-running-runs N] [--max-running-steps N]
[--max-pending-runs N] [--share N] [--quota-webhook-endpoints N] [--quota-schedules N]
[--quota-rate-limits N] [--quota-event-streams N] [--quota-runner-polls N]
[--quota-webhooks-in-flight N] [--quota-artifacts N] [--quota-artifact-bytes N]
[--quota-parked-waits N]`: an organization's limits
(docs/fairness.md) through ``run_admission.limits_set`` and its quotas (docs/tenants.md)
through ``billing.quotas.quotas_set``, as the admin sets them; `default` puts one back to
its setting. Prints the limits in force as JSON, the quotas under `quotas`."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction

from billing import quotas
from billing.selectors import organization_named
from runs.admission import run_admission

DEFAULT = "default"


class Command(BaseCommand):
    help = "Set an organization's limits (by name or id); print the limits in force as JSON."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("organization", help="its name or id")
        for name in run_admission.LIMIT_FIELDS:
            parser.add_argument(
                f"--{name.replace('_', '-')}",
                dest=name,
                help=f"a whole number >= 1{'' if name == 'share' else ', or default'}",
            )
        for field in quotas.FIELDS:
            parser.add_argument(
                f"--{field.replace('_', '-')}", dest=field, help="a whole number >= 0, or default"
            )

    def handle(self, *args: Any, **options: Any) -> None:
        wanted = options["organization"].strip()
        found = organization_named(wanted)
        if found is None:
            raise CommandError(f"no organization named or with id {wanted!r}")
        limits = {
            name: _read(name, options[name], defaultable=name != "share")
            for name in run_admission.LIMIT_FIELDS
            if options.get(name) is not None
        }
        wanted_quotas = {
            name: _read(field, options[field], defaultable=True)
            for name, (field, _, _) in quotas.QUOTAS.items()
            if options.get(field) is not None
        }
        try:
            # One transaction: a bad quota leaves the limits as they were, and the reverse.
            with transaction.atomic():
                applied = run_admission.limits_set(found.pk, actor="cli", **limits)
                in_force = quotas.quotas_set(found.pk, actor="cli", **wanted_quotas)
        except (run_admission.InvalidLimits, quotas.InvalidQuotas) as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(
            json.dumps({"organization_id": str(found.pk), **asdict(applied), "quotas": in_force})
        )


def _read(name: str, value: str, *, defaultable: bool) -> int | None:
    if value == DEFAULT and defaultable:
        return None
    try:
        return int(value)
    except ValueError:
        raise CommandError(f"--{name.replace('_', '-')}: not a whole number: {value!r}") from None
