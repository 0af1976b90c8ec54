"""The floor of `make load`: what a request costs here before the API does anything.

``FloorApi`` answers ``GET /api/v1/load-floor`` with the caller's organization, read by
primary key: one row, through everything every API request goes through (gunicorn, the
middleware, ``api.base.ApiView``: API-key authentication, scopes, throttling, the query
check, the JSON renderer) and nothing of the API's own logic. `make load` measures it
beside the reads and the mix, on the same gunicorn, so that their requests/s read as a
fraction of what Django, DRF and authentication allow on this machine.

This module is the URLconf of the load stack's web process only
(``reliability.load_settings``); the public URLconf (``config.urls``) never routes the
floor, so it can never be called on a real deployment.
"""

from __future__ import annotations

from django.urls import path
from rest_framework.request import Request
from rest_framework.response import Response

from api.authentication import organization_of
from api.base import ApiView
from billing.models import Organization
from config.urls import handler404, handler500
from config.urls import urlpatterns as public_urlpatterns
from reliability.load_mix import FLOOR

FLOOR_NAME = "load-floor"


class FloorApi(ApiView):
    def get(self, request: Request) -> Response:
        # Read again by primary key, though authentication already loaded it: the floor
        # is one query of the view's own, as the cheapest real read would be.
        row = Organization.objects.values("id", "name").get(pk=organization_of(request).pk)
        return Response({"id": str(row["id"]), "name": row["name"]})


# First: config.urls ends with a catch-all for /api/ (a JSON 404), which would answer
# for the floor's path too. One more pattern tried costs every request a few µs.
urlpatterns = [
    path(FLOOR.removeprefix("/"), FloorApi.as_view(), name=FLOOR_NAME),
    *public_urlpatterns,
]
# Django reads the error handlers from the root URLconf: the public ones, unchanged.
__all__ = ["handler404", "handler500", "urlpatterns"]
