"""`/`, the front page (and the admin's "View site"): links to the dashboard, the admin,
the API, its docs and the health check, each of which answers."""

from __future__ import annotations

import re

import pytest
from django.conf import settings
from django.contrib.staticfiles import finders
from django.templatetags.static import static
from django.test import Client

from web.home import FAVICON

pytestmark = pytest.mark.django_db


def test_the_front_page_links_to_the_dashboard_the_api_its_docs_and_health() -> None:
    response = Client().get("/")

    assert response.status_code == 200
    links = set(re.findall(r'href="([^"]+)"', response.content.decode()))
    assert {
        "/admin/dashboard/",
        "/admin/",
        "/api/v1/",
        "/api/docs/",
        "/api/redoc/",
        "/api/schema/",
        "/healthz",
    } <= links


def test_every_link_on_the_front_page_leads_somewhere(admin_client: Client) -> None:
    page = Client().get("/").content.decode()

    for link in re.findall(r'href="(/[^"]*)"', page):
        if link.startswith(settings.STATIC_URL):  # WhiteNoise's, not these settings'
            assert finders.find(link.removeprefix(settings.STATIC_URL)), link
            continue
        response = admin_client.get(link)
        # /healthz answers 503 here: no worker, no beat; it answers all the same.
        assert response.status_code in (200, 503), (link, response.status_code)


def test_the_pages_name_the_icon_and_favicon_ico_leads_to_it(admin_client: Client) -> None:
    """A browser asked for /favicon.ico on every admin page: a 404 in its console, and a
    warning line in the log."""
    icon = static(FAVICON)

    pages = [
        admin_client.get(path).content.decode() for path in ("/", "/admin/", "/admin/dashboard/")
    ]
    favicon = Client().get("/favicon.ico")

    for page in pages:
        assert f'<link rel="icon" type="image/svg+xml" href="{icon}">' in page
    assert favicon.status_code == 302
    assert favicon["Location"] == icon
    assert finders.find(FAVICON)
