"""API keys: stored hashed, shown once, revocable (by the admin and by
`manage.py revoke_api_key`)."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from rest_framework.test import APIClient

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


def revoke_command(given: str) -> dict[str, object]:
    out = StringIO()
    call_command("revoke_api_key", given, stdout=out)
    result: dict[str, object] = json.loads(out.getvalue())
    return result


def test_revoke_api_key_revokes_the_key_with_that_prefix_and_no_other() -> None:
    organization = factories.org()
    api_key, raw = api_key_create(organization=organization, name="ci")
    _, other = api_key_create(organization=organization, name="dashboard")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert client.get("/api/v1/runs").status_code == 200

    result = revoke_command(api_key.prefix)

    assert (result["prefix"], result["key_name"], result["already_revoked"]) == (
        api_key.prefix,
        "ci",
        False,
    )
    assert ApiKey.objects.get(pk=api_key.pk).revoked_at is not None
    assert api_key_authenticate(raw) is None
    assert api_key_authenticate(other) is not None
    answer = client.get("/api/v1/runs")
    assert (answer.status_code, answer.json()["code"]) == (401, "authentication_failed")


def test_revoke_api_key_takes_the_prefix_as_lists_show_it_and_twice_changes_nothing() -> None:
    api_key, _ = api_key_create(organization=factories.org())

    first = revoke_command(f"ork_{api_key.prefix}")
    again = revoke_command(f"ork_{api_key.prefix}_and-whatever-follows")

    assert (first["already_revoked"], again["already_revoked"]) == (False, True)
    assert first["revoked_at"] == again["revoked_at"]


def test_revoke_api_key_refuses_an_unknown_prefix() -> None:
    with pytest.raises(CommandError, match="no API key with prefix"):
        revoke_command("00000000")
