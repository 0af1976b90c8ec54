from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularRedocView, SpectacularSwaggerView

from api.metrics import metrics_view
from orchestrator.dashboard import dashboard_view
from orchestrator.health import healthz

# The admin's index links to the operators' dashboard (its template extends Django's).
admin.site.index_template = "admin/orchestrator_index.html"

urlpatterns = [
    path("healthz", healthz, name="healthz"),
    path("metrics", metrics_view, name="metrics"),
    # Before the admin's own URLs, which would answer 404 for it. Staff only.
    path("admin/dashboard/", admin.site.admin_view(dashboard_view), name="admin-dashboard"),
    path("admin/", admin.site.urls),
    path("api/v1/", include("api.urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="docs"),
    path("api/redoc/", SpectacularRedocView.as_view(url_name="schema"), name="redoc"),
]

# JSON errors under /api/ for what Django answers itself (unknown routes, malformed ids,
# crashes outside a view); Django's own pages elsewhere.
handler404 = "api.errors.not_found"
handler500 = "api.errors.server_error"
