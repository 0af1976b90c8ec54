"""API keys: stored hashed, shown once, revocable."""

from __future__ import annotations

import pytest

from billing.models import ApiKey
from billing.services import api_key_authenticate, api_key_create, api_key_revoke, hash_api_key
from tests import factories

pytestmark = pytest.mark.django_db


def test_only_a_hash_and_a_prefix_are_stored() -> None:
    organization = factories.org()

    api_key, raw = api_key_create(organization=organization, name="ci")

    stored = ApiKey.objects.get(pk=api_key.pk)
    assert stored.key_hash == hash_api_key(raw)
    assert raw.startswith(f"ork_{stored.prefix}_")
    assert raw not in {str(value) for value in vars(stored).values()}


def test_authenticate_accepts_the_key_and_refuses_unknown_malformed_and_revoked() -> None:
    organization = factories.org()
    api_key, raw = api_key_create(organization=organization)

    found = api_key_authenticate(raw)
    assert found is not None
    assert found.organization == organization
    assert found.last_used_at is not None
    assert api_key_authenticate(raw + "x") is None
    assert api_key_authenticate("not-a-key") is None
    assert api_key_authenticate("") is None

    api_key_revoke(api_key=api_key)
    assert api_key_authenticate(raw) is None
