"""`GET /metrics`: Prometheus's text exposition of ``orchestrator.metrics`` (README,
Metrics), answering only to `Authorization: Bearer <METRICS_TOKEN>`; with no token
configured it does not exist (404). ``RequestMetrics`` counts the API's requests by
route, method and status for it."""

from __future__ import annotations

import hmac
from collections.abc import Callable

from django.conf import settings
from django.http import HttpRequest, HttpResponse, HttpResponseNotFound
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from api.errors import UNKNOWN_ROUTE
from orchestrator import metrics


def metrics_view(request: HttpRequest) -> HttpResponse:
    token = str(settings.METRICS_TOKEN or "")
    if not token:
        return HttpResponseNotFound()
    sent = request.headers.get("Authorization", "")
    if not hmac.compare_digest(sent.encode(), f"Bearer {token}".encode()):
        response = HttpResponse("unauthorized\n", status=401, content_type="text/plain")
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    registry = CollectorRegistry(auto_describe=False)
    registry.register(metrics.OrchestratorCollector())
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)


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
