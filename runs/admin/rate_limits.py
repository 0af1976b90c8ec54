"""Rate limits in the admin (docs/rate-limits.md): organizations' limits and the
operators' global limits on a tool."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from ratelimits.models import RateLimit
from runs import step_admission
from runs.models import Step


@admin.register(RateLimit)
class RateLimitAdmin(admin.ModelAdmin[RateLimit]):
    """Organizations' limits and the operators' global limits on a tool (no organization,
    a tool named): saving or deleting one re-plans the steps waiting for it
    (``runs.step_admission``), as the API does."""

    list_display = ("name", "organization", "tool", "limit", "period_ms", "waiting", "updated_at")
    list_filter = ("organization",)
    search_fields = ("name", "tool")
    fields = ("organization", "name", "tool", "limit", "period_ms")

    @admin.display(description="steps waiting")
    def waiting(self, limit: RateLimit) -> int:
        reason = step_admission.WAITING_PREFIX + (
            f"tool:{limit.tool}" if limit.tool else limit.name
        )
        return Step.objects.filter(status="pending", waiting_reason=reason).count()

    def save_model(self, request: HttpRequest, obj: RateLimit, form: Any, change: bool) -> None:
        super().save_model(request, obj, form, change)
        step_admission.limit_saved(obj)

    def delete_model(self, request: HttpRequest, obj: RateLimit) -> None:
        super().delete_model(request, obj)
        step_admission.limit_saved(obj)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[RateLimit]) -> None:
        removed = list(queryset)
        super().delete_queryset(request, queryset)
        for limit in removed:
            step_admission.limit_saved(limit)
