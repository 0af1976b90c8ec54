"""Secrets through the API: written with PUT, listed by name only, deleted; any string is
a value; stored encrypted, readable after a key rotation; one organization never sees or
touches another's."""

from __future__ import annotations

import json
from typing import Any

import pytest
from cryptography.fernet import Fernet
from django.db import connection
from pytest_django.fixtures import Settings as SettingsWrapper

from billing.models import Secret
from billing.secrets import SecretUnreadable, secret_put, secret_values, secrets_rotate
from tests.tenants import Tenant

pytestmark = pytest.mark.django_db

VALUE = "s3cr3t-value-that-must-never-be-shown"
ANY_STRINGS = [
    pytest.param("", id="empty"),
    pytest.param("héllo wörld ✓ 🎉 日本", id="unicode"),
    pytest.param("\u0000", id="nul"),
    pytest.param("a\u0000b\nc\t ", id="nul-and-whitespace-kept"),
    pytest.param("\ud800 lone surrogate", id="unpaired-surrogate"),
    pytest.param("x" * 200_000, id="long"),
    pytest.param("  padded  ", id="padding-kept"),
]


def put(tenant: Tenant, name: str, body: Any) -> Any:
    # Raw JSON (ASCII escapes), so that any string, a lone surrogate included, is sendable.
    return tenant.client.put(
        f"/api/v1/secrets/{name}", data=json.dumps(body), content_type="application/json"
    )


def delete(tenant: Tenant, name: str) -> Any:
    return tenant.client.delete(f"/api/v1/secrets/{name}")


def value_of(tenant: Tenant, name: str) -> str | None:
    return secret_values(organization_id=tenant.organization.pk, names=[name]).get(name)


def test_put_creates_then_replaces_and_never_answers_the_value(tenant: Tenant) -> None:
    created = put(tenant, "API_TOKEN", {"value": VALUE})
    replaced = put(tenant, "API_TOKEN", {"value": "second"})

    assert created.status_code == 201, created.content
    assert replaced.status_code == 200, replaced.content
    assert set(created.json()) == {"name", "created_at", "updated_at"}
    assert created.json()["name"] == "API_TOKEN"
    assert replaced.json()["created_at"] == created.json()["created_at"]
    assert replaced.json()["updated_at"] > created.json()["updated_at"]
    assert VALUE.encode() not in created.content
    assert value_of(tenant, "API_TOKEN") == "second"


def test_the_list_shows_names_and_dates_and_no_value_anywhere(tenant: Tenant) -> None:
    for name in ("B_TOKEN", "A_TOKEN", "_c"):
        put(tenant, name, {"value": f"{VALUE}-{name}"})

    response = tenant.get("/api/v1/secrets")

    assert response.status_code == 200
    body = response.json()
    assert body["count"] == 3
    assert [row["name"] for row in body["results"]] == ["A_TOKEN", "B_TOKEN", "_c"]
    assert all(set(row) == {"name", "created_at", "updated_at"} for row in body["results"])
    assert b'"value"' not in response.content
    assert VALUE.encode() not in response.content


def test_the_list_is_paginated_like_every_other(tenant: Tenant) -> None:
    for index in range(3):
        secret_put(organization=tenant.organization, name=f"S{index}", value="v")

    page = tenant.get("/api/v1/secrets", {"page_size": 2, "page": 2}).json()

    assert page["count"] == 3
    assert [row["name"] for row in page["results"]] == ["S2"]
    assert page["next"] is None
    assert page["previous"]
    assert tenant.get("/api/v1/secrets", {"nope": 1}).status_code == 400


def test_delete_answers_204_then_404(tenant: Tenant) -> None:
    put(tenant, "GONE", {"value": VALUE})

    first = delete(tenant, "GONE")
    second = delete(tenant, "GONE")

    assert first.status_code == 204
    assert second.status_code == 404
    assert second.json() == {"code": "not_found", "message": "not found", "details": None}
    assert not Secret.objects.filter(organization=tenant.organization).exists()


@pytest.mark.parametrize(
    ("body", "path"),
    [
        ({}, "value"),
        (None, ""),
        ({"value": None}, "value"),
        ({"value": 12}, "value"),
        ({"value": True}, "value"),
        ({"value": ["a"]}, "value"),
        ({"value": {"a": "b"}}, "value"),
        ({"value": "v", "name": "OTHER"}, "name"),
    ],
    ids=["empty", "null-body", "null", "number", "boolean", "list", "object", "unknown-field"],
)
def test_a_put_without_a_string_value_is_invalid(tenant: Tenant, body: Any, path: str) -> None:
    response = put(tenant, "TOKEN", body)

    assert response.status_code == 400, response.content
    assert response.json()["code"] == "invalid_request"
    assert [problem["path"] for problem in response.json()["details"]] == [path]
    assert not Secret.objects.exists()


@pytest.mark.parametrize(
    "name",
    ["1TOKEN", "my-token", "a.b", "é", "x" * 101, "has%20space", "%00"],
    ids=["digit-first", "hyphen", "dot", "non-ascii", "too-long", "space", "nul"],
)
def test_a_put_with_an_invalid_name_is_invalid_naming_it(tenant: Tenant, name: str) -> None:
    response = put(tenant, name, {"value": VALUE})

    assert response.status_code == 400, response.content
    assert response.json()["code"] == "invalid_request"
    assert response.json()["details"][0]["path"] == "name"
    assert not Secret.objects.exists()


def test_the_longest_name_is_accepted(tenant: Tenant) -> None:
    assert put(tenant, "N" * 100, {"value": "v"}).status_code == 201


@pytest.mark.parametrize("value", ANY_STRINGS)
def test_any_string_is_a_value_and_round_trips(tenant: Tenant, value: str) -> None:
    response = put(tenant, "ANY", {"value": value})

    assert response.status_code == 201, response.content
    assert value_of(tenant, "ANY") == value


def test_other_strings_of_the_body_are_still_checked(tenant: Tenant) -> None:
    response = tenant.client.put(
        "/api/v1/secrets/ANY", data='{"value": "v", "\\u0000": 1}', content_type="application/json"
    )

    assert response.status_code == 400
    assert response.json()["code"] == "invalid_json"


def test_the_value_is_stored_encrypted(tenant: Tenant) -> None:
    put(tenant, "STORED", {"value": VALUE})

    with connection.cursor() as cursor:
        cursor.execute("SELECT name, value_encrypted FROM billing_secret")
        ((name, stored),) = cursor.fetchall()
        cursor.execute("SELECT row_to_json(s)::text FROM billing_secret AS s")
        (row_text,) = cursor.fetchone()

    assert name == "STORED"
    assert VALUE.encode() not in bytes(stored)
    assert VALUE not in row_text
    assert bytes(stored).startswith(b"gAAAA")  # a Fernet token


def test_organizations_never_see_or_touch_each_others_secrets(
    tenant: Tenant, other_tenant: Tenant
) -> None:
    put(tenant, "SHARED_NAME", {"value": "theirs"})

    listed = other_tenant.get("/api/v1/secrets").json()
    deleted = delete(other_tenant, "SHARED_NAME")
    own = put(other_tenant, "SHARED_NAME", {"value": "mine"})

    assert listed["count"] == 0
    assert deleted.status_code == 404
    assert own.status_code == 201  # a secret of its own, of the same name
    assert value_of(tenant, "SHARED_NAME") == "theirs"
    assert value_of(other_tenant, "SHARED_NAME") == "mine"
    assert [row["name"] for row in tenant.get("/api/v1/secrets").json()["results"]] == [
        "SHARED_NAME"
    ]


def test_a_new_first_key_encrypts_and_the_old_one_still_decrypts(
    tenant: Tenant, settings: SettingsWrapper
) -> None:
    old, new = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    settings.SECRETS_ENCRYPTION_KEYS = [old]
    secret_put(organization=tenant.organization, name="ROTATED", value=VALUE)

    settings.SECRETS_ENCRYPTION_KEYS = [new, old]
    assert value_of(tenant, "ROTATED") == VALUE  # written under the old key
    secret_put(organization=tenant.organization, name="FRESH", value="fresh")

    assert secrets_rotate() == 2
    settings.SECRETS_ENCRYPTION_KEYS = [new]  # the old key retired after the rotation
    assert value_of(tenant, "ROTATED") == VALUE
    assert value_of(tenant, "FRESH") == "fresh"

    settings.SECRETS_ENCRYPTION_KEYS = [old]
    with pytest.raises(SecretUnreadable, match="ROTATED") as caught:
        value_of(tenant, "ROTATED")
    assert VALUE not in str(caught.value)


def test_a_read_key_lists_but_cannot_write(tenant: Tenant) -> None:
    from tests.api.test_scopes import client_with

    reader = client_with(tenant, "read")
    secret_put(organization=tenant.organization, name="TOKEN", value=VALUE)

    assert reader.get("/api/v1/secrets").status_code == 200
    assert reader.put("/api/v1/secrets/TOKEN", {"value": "x"}, format="json").status_code == 403
    assert reader.delete("/api/v1/secrets/TOKEN").status_code == 403
    assert value_of(tenant, "TOKEN") == VALUE
