"""Writes for organizations and API keys. (The ledger services arrive with billing.)"""

from __future__ import annotations

import hashlib
import secrets
from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from billing.models import ApiKey, Organization

API_KEY_PREFIX = "ork"
# last_used_at is a hint for operators, not an audit log: write it at most this often.
LAST_USED_RESOLUTION = timedelta(minutes=1)


def hash_api_key(raw_key: str) -> str:
    return hashlib.sha256(raw_key.encode()).hexdigest()


@transaction.atomic
def organization_create(*, name: str) -> Organization:
    name = name.strip()
    if not name:
        raise ValueError("organization name must not be empty")
    return Organization.objects.create(name=name)


@transaction.atomic
def api_key_create(*, organization: Organization, name: str = "default") -> tuple[ApiKey, str]:
    """Create a key; return it with the raw secret, which is never stored or shown again."""
    prefix = secrets.token_hex(4)
    raw_key = f"{API_KEY_PREFIX}_{prefix}_{secrets.token_urlsafe(32)}"
    api_key = ApiKey.objects.create(
        organization=organization,
        name=name.strip() or "default",
        prefix=prefix,
        key_hash=hash_api_key(raw_key),
    )
    return api_key, raw_key


@transaction.atomic
def api_key_revoke(*, api_key: ApiKey) -> ApiKey:
    locked = ApiKey.objects.select_for_update().get(pk=api_key.pk)
    if locked.revoked_at is None:
        locked.revoked_at = timezone.now()
        locked.save(update_fields=["revoked_at"])
    return locked


def api_key_authenticate(raw_key: str) -> ApiKey | None:
    """The active key matching ``raw_key``, or None (unknown, malformed or revoked)."""
    parts = raw_key.split("_", 2)
    if len(parts) != 3 or parts[0] != API_KEY_PREFIX or len(raw_key) > 200:
        return None
    api_key = (
        ApiKey.objects.select_related("organization")
        .filter(key_hash=hash_api_key(raw_key), revoked_at__isnull=True)
        .first()
    )
    if api_key is None:
        return None
    now = timezone.now()
    if api_key.last_used_at is None or now - api_key.last_used_at > LAST_USED_RESOLUTION:
        ApiKey.objects.filter(pk=api_key.pk).update(last_used_at=now)
        api_key.last_used_at = now
    return api_key
