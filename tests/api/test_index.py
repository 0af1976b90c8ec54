"""`GET /api/v1/`: the API's index. It takes no key (like the schema it points to, it
shows nothing but routes), lists every collection of the URLconf, and each of those still
asks for a key."""

from __future__ import annotations

import pytest
from django.test import Client
from rest_framework.test import APIClient

from tests.api.routes import routes_without_parameters

pytestmark = pytest.mark.django_db


def test_the_index_lists_every_collection_without_an_api_key() -> None:
    response = APIClient().get("/api/v1/")

    assert response.status_code == 200, response.content
    body = response.json()
    assert set(body["collections"]) == {route.name for route in routes_without_parameters()}
    assert body["collections"]["runs"] == "http://testserver/api/v1/runs"
    assert body["schema"] == "http://testserver/api/schema/"
    assert body["docs"] == "http://testserver/api/docs/"
    assert body["redoc"] == "http://testserver/api/redoc/"


def test_what_the_index_lists_still_needs_a_key() -> None:
    collections = APIClient().get("/api/v1/").json()["collections"]

    for url in collections.values():
        response = APIClient().get(url)
        # A collection answers 401; a route of the runner protocol that only takes a
        # POST answers 405 before it would ask (both in the error envelope).
        assert response.status_code in (401, 405), (url, response.status_code)
        assert response.json()["code"] in ("not_authenticated", "method_not_allowed")


def test_the_index_and_the_docs_it_names_answer() -> None:
    body = APIClient().get("/api/v1/").json()

    for name in ("schema", "docs", "redoc"):
        assert Client().get(body[name]).status_code == 200, name


def test_the_index_takes_only_a_get_and_answers_others_in_json() -> None:
    response = APIClient().post("/api/v1/", {}, format="json")

    assert response.status_code == 405
    assert response.json()["code"] == "method_not_allowed"


def test_the_index_without_its_slash_is_sent_to_it() -> None:
    response = Client().get("/api/v1")

    assert response.status_code == 301
    assert response["Location"] == "/api/v1/"
