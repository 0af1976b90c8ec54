from typing import Any

from django.contrib import admin
from django.urls import include, path, re_path
from drf_spectacular.views import SpectacularAPIView, SpectacularRedocView, SpectacularSwaggerView
from rest_framework.request import Request
from rest_framework.response import Response

from api.errors import UNKNOWN_ROUTE, JsonErrors, unknown_route
from web.dashboard import dashboard_view
from web.health import healthz
from web.home import favicon_view, home_view
from web.prometheus import metrics_view

# The admin's index links to the operators' dashboard (its template extends Django's).
admin.site.index_template = "admin/orchestrator_index.html"


# The schema and its pages answer YAML and HTML; their errors, like every answer of the
# API's that is an error, are JSON.
class SchemaView(JsonErrors, SpectacularAPIView):
    pass


class SwaggerView(JsonErrors, SpectacularSwaggerView):
    pass


class RedocView(JsonErrors, SpectacularRedocView):
    """ReDoc from our own static files, and nothing from the internet: our template
    leaves out drf-spectacular's web fonts, and the page's Content-Security-Policy stops
    the one request ReDoc makes by itself, whatever its options (its menu's footer shows
    a logo from cdn.redoc.ly), before it leaves the browser."""

    template_name = "api/redoc.html"
    # No inline script is allowed: REDOC_UI_SETTINGS, which drf-spectacular renders into
    # one, stays unset.
    content_security_policy = (
        "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; "
        "font-src 'self' data:; worker-src 'self' blob:"
    )

    def finalize_response(
        self, request: Request, response: Response, *args: Any, **kwargs: Any
    ) -> Response:
        response = super().finalize_response(request, response, *args, **kwargs)
        response["Content-Security-Policy"] = self.content_security_policy
        return response


urlpatterns = [
    path("", home_view, name="home"),
    path("favicon.ico", favicon_view, name="favicon"),
    path("healthz", healthz, name="healthz"),
    path("metrics", metrics_view, name="metrics"),
    # Before the admin's own URLs, which would answer 404 for it. Staff only.
    path("admin/dashboard/", admin.site.admin_view(dashboard_view), name="admin-dashboard"),
    path("admin/", admin.site.urls),
    path("api/v1/", include("api.urls")),
    path("api/schema/", SchemaView.as_view(), name="schema"),
    path("api/docs/", SwaggerView.as_view(url_name="schema"), name="docs"),
    path("api/redoc/", RedocView.as_view(url_name="schema"), name="redoc"),
    # Last: whatever no route above matches under /api/ is a JSON 404, DEBUG or not (a
    # plain view, so not in the OpenAPI schema).
    re_path(r"^api/", unknown_route, name=UNKNOWN_ROUTE),
]

# JSON errors under /api/ for what Django answers itself (an Http404 or a crash outside
# a view); Django's own pages elsewhere.
handler404 = "api.errors.not_found"
handler500 = "api.errors.server_error"
