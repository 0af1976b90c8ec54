"""`python manage.py rotate_secrets`: re-encrypt every organization's secrets under the
first key of SECRETS_ENCRYPTION_KEYS, so that the keys after it can be retired."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from billing.secrets import SecretUnreadable, secrets_rotate


class Command(BaseCommand):
    help = (
        "Re-encrypt every secret under the first key of SECRETS_ENCRYPTION_KEYS; print "
        '{"rotated": N}. Run it after putting a new key first; then drop the old keys.'
    )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            rotated = secrets_rotate()
        except SecretUnreadable as exc:
            # Batches already rotated stay rotated: running it again after restoring the
            # missing key finishes the job.
            raise CommandError(f"{exc}; restore the key that encrypted it and run again") from exc
        self.stdout.write(json.dumps({"rotated": rotated}))
