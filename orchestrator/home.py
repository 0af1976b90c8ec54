"""`/`: the front page (the admin's "View site"): where the operators' pages, the API and
its docs, and the health check are. Public, as it shows nothing but links: each page it
links to asks for what it needs (a staff sign-in, an API key)."""

from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.views.decorators.http import require_GET


@require_GET
def home_view(request: HttpRequest) -> HttpResponse:
    return TemplateResponse(
        request, "orchestrator/home.html", {"flower_url": settings.DASHBOARD_FLOWER_URL}
    )
