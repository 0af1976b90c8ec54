"""`/`: the front page (the admin's "View site"): where the operators' pages, the API and
its docs, and the health check are. Public, as it shows nothing but links: each page it
links to asks for what it needs (a staff sign-in, an API key). And `/favicon.ico`."""

from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.templatetags.static import static
from django.views.decorators.http import require_GET

# The icon the admin's pages and the front page name (<link rel="icon">).
FAVICON = "orchestrator/favicon.svg"


@require_GET
def home_view(request: HttpRequest) -> HttpResponse:
    return TemplateResponse(request, "web/home.html", {"flower_url": settings.DASHBOARD_FLOWER_URL})


@require_GET
def favicon_view(request: HttpRequest) -> HttpResponse:
    """What a browser asks for on a page that names no icon (the API's docs, a JSON
    answer): the same icon, a static file (served by WhiteNoise)."""
    return HttpResponseRedirect(static(FAVICON))
