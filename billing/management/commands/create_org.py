"""`python manage.py create_org NAME [--credits N]`: an organization, its first API key
and its initial credits, printed as JSON (the key is shown only this once)."""

from __future__ import annotations

import json
from decimal import InvalidOperation
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import IntegrityError, transaction

from billing.models import Organization
from billing.services import api_key_create, credits_grant, organization_create, to_credits


class Command(BaseCommand):
    help = "Create an organization with an API key; print JSON (the key is shown only once)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name")
        parser.add_argument("--key-name", default="default", help="label of the API key")
        parser.add_argument(
            "--credits", default="0", help="credits granted to the new organization (decimal)"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        name = options["name"].strip()
        if not name or len(name) > 200:
            raise CommandError("NAME must be 1-200 characters")
        try:
            credits = to_credits(options["credits"])
        except (InvalidOperation, ValueError) as exc:
            raise CommandError(f"--credits must be a number, got {options['credits']!r}") from exc
        if credits < 0:
            raise CommandError("--credits cannot be negative")
        if Organization.objects.filter(name=name).exists():
            raise CommandError(f"an organization named {name!r} already exists")
        try:
            with transaction.atomic():
                organization = organization_create(name=name)
                api_key, raw_key = api_key_create(
                    organization=organization, name=options["key_name"]
                )
                if credits > 0:
                    credits_grant(
                        organization=organization,
                        amount=credits,
                        reason="initial credits (create_org)",
                        actor="cli",
                    )
        except IntegrityError as exc:
            raise CommandError(f"could not create {name!r}: {exc}") from exc
        result: dict[str, Any] = {
            "organization_id": str(organization.pk),
            "name": organization.name,
            "api_key": raw_key,
            "api_key_prefix": api_key.prefix,
            "scope": api_key.scope,
            "credits": str(credits),
        }
        self.stdout.write(json.dumps(result))
