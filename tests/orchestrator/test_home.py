"""`/`, the front page (and the admin's "View site"): links to the dashboard, the admin,
the API, its docs and the health check, each of which answers."""

from __future__ import annotations

import re

import pytest
from django.test import Client

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
        response = admin_client.get(link)
        # /healthz answers 503 here: no worker, no beat; it answers all the same.
        assert response.status_code in (200, 503), (link, response.status_code)
