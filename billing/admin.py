"""Operators' views of organizations and API keys."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.forms import ModelForm
from django.http import HttpRequest

from billing.models import ApiKey, Organization
from billing.services import api_key_create, api_key_revoke


class ApiKeyInline(admin.TabularInline[ApiKey, Organization]):
    model = ApiKey
    extra = 0
    fields = ("name", "prefix", "created_at", "last_used_at", "revoked_at")
    readonly_fields = fields
    can_delete = False
    show_change_link = True

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Organization)
class OrganizationAdmin(admin.ModelAdmin[Organization]):
    list_display = ("name", "id", "created_at")
    search_fields = ("name", "=id")
    readonly_fields = ("id", "created_at")
    inlines = (ApiKeyInline,)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin[ApiKey]):
    list_display = ("name", "prefix", "organization", "created_at", "last_used_at", "revoked_at")
    list_filter = ("revoked_at",)
    list_select_related = ("organization",)
    search_fields = ("name", "prefix", "organization__name")
    actions = ("revoke",)

    def get_fields(self, request: HttpRequest, obj: ApiKey | None = None) -> tuple[str, ...]:
        if obj is None:
            return ("organization", "name")
        return ("organization", "name", "prefix", "created_at", "last_used_at", "revoked_at")

    def get_readonly_fields(
        self, request: HttpRequest, obj: ApiKey | None = None
    ) -> tuple[str, ...]:
        if obj is None:
            return ()
        return ("organization", "prefix", "created_at", "last_used_at", "revoked_at")

    def save_model(
        self, request: HttpRequest, obj: ApiKey, form: ModelForm[ApiKey], change: bool
    ) -> None:
        if change:
            obj.save(update_fields=["name"])
            return
        created, raw_key = api_key_create(organization=obj.organization, name=obj.name)
        obj.pk = created.pk
        obj._state.adding = False
        self.message_user(
            request,
            f"API key created. Copy it now, it will not be shown again: {raw_key}",
            messages.WARNING,
        )

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.action(description="Revoke selected API keys")
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiKey]) -> None:
        for api_key in queryset:
            api_key_revoke(api_key=api_key)
        self.message_user(request, f"{queryset.count()} key(s) revoked")
