"""Every answer under /api/ is JSON, whatever DEBUG says: a path no route matches is
`404 not_found`, a route without the method asked `405 method_not_allowed`, in the error
envelope (api/errors.py); paths outside /api/ keep Django's own pages."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from django.test import Client
from drf_spectacular.generators import SchemaGenerator

from tests.tenants import Tenant, assert_error

pytestmark = pytest.mark.django_db

# A run that does not exist; fixed, as it names tests (parallel processes must collect
# the same ones).
RUN_ID = uuid.UUID("0ecf5ff6-fbad-4b5e-bf20-8b238a09dd4e")
UNKNOWN_PATHS = [
    "/api/v1/hooks",
    "/api/v1/webhooks/",  # the route is /api/v1/webhooks
    "/api/v1/runs/",  # a route's path with a trailing slash is another path
    "/api/v1/organization/",
    f"/api/v1/runs/{RUN_ID}/",
    f"/api/v1/runs/{RUN_ID}/nothing/deeper/still",
    "/api/v1/runs/not-a-uuid",
    "/api/v1/runs//start",
    "/api/v1//",
    "/api/v2/runs",
    "/api/",
    "/api/nothing",
    "/api/v1/runs/?status=running",
]
METHODS = ["get", "post", "put", "patch", "delete", "options", "head"]


@pytest.fixture(params=[False, True], ids=["debug-off", "debug-on"])
def debug(request: pytest.FixtureRequest, settings: Any) -> bool:
    # With DEBUG on, Django answers an unmatched URL with its technical 404 page (every
    # route listed) without calling handler404: both ways must answer JSON.
    settings.DEBUG = request.param
    return bool(request.param)


@pytest.mark.parametrize("path", UNKNOWN_PATHS)
def test_an_unknown_api_path_is_a_json_404_with_or_without_debug(
    tenant: Tenant, debug: bool, path: str
) -> None:
    body = assert_error(tenant.client.get(path), 404, "not_found")

    assert body == {"code": "not_found", "message": "not found", "details": None}


def test_a_404_body_is_written_as_every_other_error_body(tenant: Tenant, debug: bool) -> None:
    """A path no route matches was answered by JsonResponse, spaced unlike the API's."""
    unknown_path = tenant.client.get("/api/v1/hooks")
    unknown_run = tenant.client.get(f"/api/v1/runs/{RUN_ID}")

    assert unknown_run.status_code == unknown_path.status_code == 404
    assert unknown_path.content == unknown_run.content
    assert unknown_path.content == b'{"code":"not_found","message":"not found","details":null}'


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("path", ["/api/v1/hooks", "/api/v1/runs/", "/api/v1/runs/x/y"])
def test_every_method_on_an_unknown_api_path_is_a_json_404(
    tenant: Tenant, debug: bool, method: str, path: str
) -> None:
    response = getattr(tenant.client, method)(path, {"name": "hook"}, format="json")

    assert response.status_code == 404
    assert response["Content-Type"] == "application/json"
    if method != "head":  # a HEAD answer has no body to read
        assert response.json()["code"] == "not_found"


def test_a_post_to_an_unknown_api_path_is_a_404_not_a_csrf_failure(debug: bool) -> None:
    # A browser-like client that sends a session cookie and no CSRF token: Django's
    # CSRF check must not answer its HTML 403 before the route is known to be unknown.
    client = Client(enforce_csrf_checks=True)

    response = client.post("/api/v1/hooks", {"url": "https://x"}, content_type="application/json")

    assert_error(response, 404, "not_found")


def test_an_unknown_api_path_is_a_404_without_an_api_key_too(debug: bool) -> None:
    assert_error(Client().get("/api/v1/hooks"), 404, "not_found")


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("put", "/api/v1/runs"),
        ("delete", "/api/v1/runs"),
        ("post", f"/api/v1/runs/{RUN_ID}"),
        ("post", "/api/v1/billing/balance"),
        ("get", f"/api/v1/runs/{RUN_ID}/start"),
    ],
)
def test_a_known_route_without_the_method_is_a_json_405_with_or_without_debug(
    tenant: Tenant, debug: bool, method: str, path: str
) -> None:
    response = getattr(tenant.client, method)(path, {}, format="json")

    assert_error(response, 405, "method_not_allowed")
    assert response["Allow"]


@pytest.mark.parametrize("path", ["/api/schema/", "/api/docs/", "/api/redoc/"])
def test_the_schema_and_its_pages_answer_a_method_they_lack_in_json(debug: bool, path: str) -> None:
    # They answer YAML and HTML; their errors would be too, but for api.errors.JsonErrors.
    response = Client().post(path, {}, content_type="application/json")

    assert_error(response, 405, "method_not_allowed")


def test_a_schema_page_asked_without_its_slash_is_still_sent_to_it(debug: bool) -> None:
    # The catch-all makes every /api/ path a route, so Django's APPEND_SLASH no longer
    # redirects by itself; the catch-all keeps what it did for the pages that have one.
    response = Client().get("/api/docs?x=1")

    assert response.status_code == 301
    assert response["Location"] == "/api/docs/?x=1"
    assert_error(Client().post("/api/docs"), 404, "not_found")


def test_the_schema_lists_no_catch_all_route() -> None:
    schema = SchemaGenerator().get_schema(request=None, public=True)

    paths = set(schema["paths"])
    assert paths, "the schema lists the API's routes"
    assert all(path.startswith("/api/v1/") for path in paths)
    assert not any("{path}" in path or path.rstrip("/") in ("/api", "/api/v1") for path in paths)


def test_the_schema_served_is_still_the_openapi_document(debug: bool) -> None:
    response = Client().get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")

    assert response.status_code == 200
    assert "/api/v1/runs" in response.json()["paths"]


@pytest.mark.parametrize("path", ["/not-the-api", "/admin/nothing-here/", "/apinothing"])
def test_paths_outside_the_api_keep_djangos_own_404_page(
    client: Client, debug: bool, path: str
) -> None:
    response = client.get(path)

    # The admin sends anonymous visitors to its login page; elsewhere Django's 404.
    assert response.status_code in (302, 404)
    assert "application/json" not in response.get("Content-Type", "")
