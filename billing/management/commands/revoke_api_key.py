"""`python manage.py revoke_api_key PREFIX`: revoke an API key by its prefix (the part
lists show, `ork_<prefix>_...`), through ``billing.services.api_key_revoke`` as the
admin's action does. Prints one JSON line; a key revoked already stays as it was."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from billing.models import ApiKey
from billing.services import API_KEY_PREFIX, api_key_revoke


def prefix_of(given: str) -> str:
    """The key's prefix from what an operator pasted: the prefix itself, or
    `ork_<prefix>` as lists show it (a whole key too: only its prefix is read)."""
    parts = given.strip().split("_")
    if len(parts) >= 2 and parts[0] == API_KEY_PREFIX:
        return parts[1]
    return given.strip()


class Command(BaseCommand):
    help = "Revoke an API key by its prefix; print JSON. Its next request answers 401."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("prefix", help="the key's prefix (as lists show it: ork_PREFIX)")

    def handle(self, *args: Any, **options: Any) -> None:
        prefix = prefix_of(options["prefix"])
        api_key = ApiKey.objects.select_related("organization").filter(prefix=prefix).first()
        if api_key is None:
            raise CommandError(f"no API key with prefix {prefix!r}")
        was_revoked = api_key.revoked_at is not None
        revoked = api_key_revoke(api_key=api_key)
        result = {
            "prefix": revoked.prefix,
            "key_name": revoked.name,
            "organization": api_key.organization.name,
            "revoked_at": revoked.revoked_at.isoformat() if revoked.revoked_at else None,
            "already_revoked": was_revoked,
        }
        self.stdout.write(json.dumps(result))
