"""``RequestMetrics`` counts the API's requests by route, method and status for Prometheus
(``common.metrics``; `GET /metrics` is ``web.prometheus``)."""

from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse

from api.errors import UNKNOWN_ROUTE
from common import metrics


class RequestMetrics:
    """Counts every request under /api/ by its route pattern (not its path: ids would make
    a series per run), method and status."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if request.path.startswith("/api/"):
            match = getattr(request, "resolver_match", None)
            if match is None or not match.route or match.url_name == UNKNOWN_ROUTE:
                route = "unmatched"
            else:
                route = f"/{match.route}"
            metrics.api_request(route, request.method or "", response.status_code)
        return response
