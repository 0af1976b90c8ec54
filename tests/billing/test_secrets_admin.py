"""Secrets in the admin: names and dates listed, the value write-only (a password input,
never rendered back), saved through the service, so stored encrypted."""

from __future__ import annotations

import pytest
from django.test import Client

from billing.models import Secret
from billing.secrets import secret_put, secret_values
from tests import factories

pytestmark = pytest.mark.django_db

VALUE = "admin-typed-secret-value-4b3c2d1e"
ADD = "/admin/billing/secret/add/"


def value_of(organization_id: object, name: str) -> str | None:
    return secret_values(organization_id=str(organization_id), names=[name]).get(name)


def test_adding_a_secret_stores_it_encrypted_through_the_service(operator: Client) -> None:
    organization = factories.org()
    form = operator.get(ADD).content.decode()
    assert 'type="password"' in form

    response = operator.post(
        ADD, {"organization": organization.pk, "name": "API_TOKEN", "value": VALUE}
    )

    assert response.status_code == 302, response.content.decode()[:2000]
    secret = Secret.objects.get(organization=organization, name="API_TOKEN")
    assert VALUE.encode() not in bytes(secret.value_encrypted)
    assert value_of(organization.pk, "API_TOKEN") == VALUE


def test_the_value_is_never_shown_and_an_empty_field_keeps_it(operator: Client) -> None:
    organization = factories.org()
    secret, _ = secret_put(organization=organization, name="KEPT", value=VALUE)
    change = f"/admin/billing/secret/{secret.pk}/change/"

    page = operator.get(change).content.decode()
    listing = operator.get("/admin/billing/secret/").content.decode()
    operator.post(change, {"value": ""})

    assert VALUE not in page
    assert VALUE not in listing
    assert "KEPT" in listing
    assert value_of(organization.pk, "KEPT") == VALUE


def test_a_new_value_replaces_the_old_one(operator: Client) -> None:
    organization = factories.org()
    secret, _ = secret_put(organization=organization, name="ROTATED", value=VALUE)

    response = operator.post(f"/admin/billing/secret/{secret.pk}/change/", {"value": "new"})

    assert response.status_code == 302
    assert value_of(organization.pk, "ROTATED") == "new"


def test_an_invalid_name_is_refused(operator: Client) -> None:
    organization = factories.org()

    response = operator.post(ADD, {"organization": organization.pk, "name": "my-token"})

    assert response.status_code == 200  # the form again, with the error
    assert "letters, digits or _" in response.content.decode()
    assert not Secret.objects.exists()


def test_a_name_the_organization_already_has_is_refused(operator: Client) -> None:
    organization = factories.org()
    secret_put(organization=organization, name="TAKEN", value=VALUE)

    response = operator.post(ADD, {"organization": organization.pk, "name": "TAKEN", "value": "x"})

    assert response.status_code == 200
    assert value_of(organization.pk, "TAKEN") == VALUE


def test_deleting_goes_through_the_service(operator: Client) -> None:
    organization = factories.org()
    secret, _ = secret_put(organization=organization, name="GONE", value=VALUE)

    operator.post(f"/admin/billing/secret/{secret.pk}/delete/", {"post": "yes"})

    assert not Secret.objects.exists()
