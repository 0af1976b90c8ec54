"""Artifacts for operators: per run, with their size and expiry, a download link that
goes through the same checks as the API's, and the storage each organization holds."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import (
    Http404,
    HttpRequest,
    HttpResponseBase,
    HttpResponseRedirect,
    StreamingHttpResponse,
)
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString

from artifacts import services
from artifacts.models import Artifact, OrganizationStorage
from artifacts.selectors import (
    ArtifactNotFound,
    StorageUsage,
    organization_storage,
    with_expiry,
)
from common.admin import ReadOnlyAdminMixin


@admin.register(Artifact)
class ArtifactAdmin(ReadOnlyAdminMixin, admin.ModelAdmin[Artifact]):
    list_display = (
        "name",
        "run",
        "organization",
        "status",
        "size",
        "expires",
        "created_at",
        "download",
    )
    list_filter = ("status", "content_type", "created_at")
    list_select_related = ("run", "organization")
    search_fields = ("=id", "=run__id", "name")
    ordering = ("-created_at",)
    show_full_result_count = False
    exclude = ("key", "upload_id")

    def get_queryset(self, request: HttpRequest) -> QuerySet[Artifact]:
        return with_expiry(super().get_queryset(request))

    @admin.display(description="expires")
    def expires(self, artifact: Any) -> Any:
        return artifact.expires_at or "when its run has ended + retention"

    @admin.display(description="download")
    def download(self, artifact: Artifact) -> SafeString:
        if artifact.status != "available":
            return format_html("<em>{}</em>", artifact.status)
        url = reverse("admin:artifacts_artifact_download", args=[artifact.pk])
        return format_html('<a href="{}">download</a>', url)

    def get_urls(self) -> list[URLPattern]:
        download = self.admin_site.admin_view(self.download_view)
        route = path("<uuid:artifact_id>/download/", download, name="artifacts_artifact_download")
        return [route, *super().get_urls()]

    def download_view(self, request: HttpRequest, artifact_id: Any) -> HttpResponseBase:
        """The API's download, for staff: through the same service (and its checks),
        as the artifact's organization."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        artifact = Artifact.objects.filter(pk=artifact_id).first()
        if artifact is None:
            raise Http404("no such artifact")
        try:
            found = services.download(organization=artifact.organization, artifact_id=artifact.pk)
        except (ArtifactNotFound, services.ArtifactNotReady) as exc:
            raise Http404(str(exc)) from exc
        if found.url is not None:
            return HttpResponseRedirect(found.url)
        assert found.chunks is not None
        response = StreamingHttpResponse(found.chunks, content_type=artifact.content_type)
        response["Content-Disposition"] = "attachment"
        return response


@admin.register(OrganizationStorage)
class OrganizationStorageAdmin(ReadOnlyAdminMixin, admin.ModelAdmin[OrganizationStorage]):
    list_display = ("name", "artifact_bytes", "gigabyte_hours")
    fields = ("name",)
    ordering = ("name",)
    search_fields = ("name",)

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> Any:
        self._usage = organization_storage()
        return super().changelist_view(request, extra_context)

    def _of(self, organization: OrganizationStorage) -> StorageUsage:
        usage: dict[Any, StorageUsage] = getattr(self, "_usage", {})
        return usage.get(organization.pk, StorageUsage(0, Decimal(0)))

    @admin.display(description="artifact bytes held")
    def artifact_bytes(self, organization: OrganizationStorage) -> int:
        return self._of(organization).bytes_held

    @admin.display(description="GB-hours stored (not charged yet)")
    def gigabyte_hours(self, organization: OrganizationStorage) -> str:
        return f"{self._of(organization).byte_hours / 10**9:.6f}"
