"""``GET /api/v1/``: the API's index, where a client (or a person following `make run`'s
link) starts: the collections it can reach, read from the URLconf so the list cannot
drift from the routes, and where the schema and its docs are.

Like the schema it points to, it describes and exposes nothing, so it takes no API key:
the collections it names answer 401 without one. Not an operation of the schema (which
is itself the machine-readable index).
"""

from __future__ import annotations

from typing import Any

from django.urls import URLPattern, get_resolver, reverse
from drf_spectacular.utils import extend_schema
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response

from api.base import ApiView


def collections() -> dict[str, str]:
    """Every route of /api/v1/ without a parameter in its path, by name, in URLconf order
    (the runner protocol's routes, `runner-*`, are for runners: docs/runners.md)."""
    _, api_routes = get_resolver().namespace_dict["api"]
    return {
        str(pattern.name): reverse(f"api:{pattern.name}")
        for pattern in api_routes.url_patterns
        if isinstance(pattern, URLPattern)
        and "<" not in str(pattern.pattern)
        and pattern.name != "index"
    }


class ApiIndexApi(ApiView):
    authentication_classes = ()
    permission_classes = (AllowAny,)
    throttle_classes = ()

    @extend_schema(exclude=True)
    def get(self, request: Request) -> Response:
        absolute = request.build_absolute_uri
        body: dict[str, Any] = {
            "name": "Run orchestrator API",
            "version": "1",
            "authentication": "Authorization: Bearer <API key>; everything listed here "
            "needs one (manage.py create_org NAME prints an organization's first key)",
            "errors": "{code, message, details}",
            "schema": absolute(reverse("schema")),
            "docs": absolute(reverse("docs")),
            "redoc": absolute(reverse("redoc")),
            "collections": {name: absolute(path) for name, path in collections().items()},
        }
        return Response(body)
