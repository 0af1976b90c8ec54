"""`python manage.py create_org NAME`: a new organization and its first API key, as JSON."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import IntegrityError, transaction

from billing.models import Organization
from billing.services import api_key_create, organization_create


class Command(BaseCommand):
    help = "Create an organization with an API key; print JSON (the key is shown only once)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name")
        parser.add_argument("--key-name", default="default", help="label of the API key")

    def handle(self, *args: Any, **options: Any) -> None:
        name = options["name"].strip()
        if not name or len(name) > 200:
            raise CommandError("NAME must be 1-200 characters")
        if Organization.objects.filter(name=name).exists():
            raise CommandError(f"an organization named {name!r} already exists")
        try:
            with transaction.atomic():
                organization = organization_create(name=name)
                api_key, raw_key = api_key_create(
                    organization=organization, name=options["key_name"]
                )
        except IntegrityError as exc:
            raise CommandError(f"could not create {name!r}: {exc}") from exc
        result: dict[str, Any] = {
            "organization_id": str(organization.pk),
            "name": organization.name,
            "api_key": raw_key,
            "api_key_prefix": api_key.prefix,
        }
        self.stdout.write(json.dumps(result))
