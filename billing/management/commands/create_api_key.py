"""`python manage.py create_api_key ORG_NAME [--scope full|read|runner] [--name LABEL]`:
a new API key of an existing organization, printed as one JSON line (shown only once)."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from billing.models import ApiKeyScope, Organization
from billing.services import api_key_create


class Command(BaseCommand):
    help = "Create an API key for an organization; print JSON (the key is shown only once)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("organization", help="the organization's name")
        parser.add_argument(
            "--scope",
            default=ApiKeyScope.FULL,
            help="full (every route), read (GET routes only) or runner (runner routes only)",
        )
        parser.add_argument("--name", default="default", help="label of the API key")

    def handle(self, *args: Any, **options: Any) -> None:
        scope = options["scope"]
        if scope not in ApiKeyScope.values:
            raise CommandError(
                f"unknown scope {scope!r}; use one of {', '.join(ApiKeyScope.values)}"
            )
        try:
            organization = Organization.objects.get(name=options["organization"].strip())
        except Organization.DoesNotExist as exc:
            raise CommandError(f"no organization named {options['organization']!r}") from exc
        api_key, raw_key = api_key_create(
            organization=organization, name=options["name"], scope=scope
        )
        result = {
            "organization_id": str(organization.pk),
            "name": organization.name,
            "api_key": raw_key,
            "api_key_prefix": api_key.prefix,
            "key_name": api_key.name,
            "scope": api_key.scope,
        }
        self.stdout.write(json.dumps(result))
