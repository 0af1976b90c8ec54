"""Operators' views of organizations, API keys and secrets."""

from __future__ import annotations

import uuid
from decimal import Decimal
from typing import Any, ClassVar

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.forms import ModelForm
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse

from billing import quotas
from billing.models import ApiKey, ApiKeyScope, LedgerEntry, Organization, Reservation, Secret
from billing.secrets import is_valid_secret_name, oncall_set, secret_delete, secret_put
from billing.selectors import organization_balance
from billing.services import api_key_create, api_key_revoke, credits_grant
from common.admin import ReadOnlyAdminMixin, actor_of


class GrantCreditsForm(forms.Form):
    amount = forms.DecimalField(min_value=Decimal("0.000001"), max_digits=18, decimal_places=6)
    reason = forms.CharField(max_length=500)
    # One key per rendered form: a double-submitted form grants once.
    idempotency_key = forms.UUIDField(widget=forms.HiddenInput)


class ApiKeyInline(admin.TabularInline[ApiKey, Organization]):
    model = ApiKey
    extra = 0
    fields = ("name", "scope", "prefix", "created_at", "last_used_at", "revoked_at")
    readonly_fields = fields
    can_delete = False
    show_change_link = True

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class OrganizationForm(ModelForm[Organization]):
    """The organization, with its on-call set through ``billing.secrets.oncall_set``:
    the webhook secret is write-only (left empty, it is kept)."""

    webhook_url = forms.URLField(
        required=False,
        max_length=1000,
        assume_scheme="https",
        help_text="Escalations are POSTed here, signed (docs/escalation.md).",
    )
    webhook_secret = forms.CharField(
        required=False,
        widget=forms.PasswordInput(render_value=False),
        max_length=500,
        help_text="The signing secret receivers verify with. Left empty, the current one is kept.",
    )
    clear_webhook_secret = forms.BooleanField(required=False)
    oncall_emails = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 3}),
        help_text="On-call addresses told of escalations, one per line or comma-separated.",
    )

    quota_webhook_endpoints = forms.IntegerField(
        required=False, min_value=0, help_text="Webhook endpoints. Empty: QUOTA_WEBHOOK_ENDPOINTS."
    )
    quota_schedules = forms.IntegerField(
        required=False, min_value=0, help_text="Schedules. Empty: QUOTA_SCHEDULES."
    )
    quota_rate_limits = forms.IntegerField(
        required=False, min_value=0, help_text="Rate limits. Empty: QUOTA_RATE_LIMITS."
    )
    quota_event_streams = forms.IntegerField(
        required=False,
        min_value=0,
        help_text="Event streams open at once. Empty: QUOTA_EVENT_STREAMS.",
    )
    quota_runner_polls = forms.IntegerField(
        required=False,
        min_value=0,
        help_text="Runner polls held at once. Empty: QUOTA_RUNNER_POLLS.",
    )
    quota_webhooks_in_flight = forms.IntegerField(
        required=False,
        min_value=0,
        help_text="Webhook deliveries sent at once. Empty: QUOTA_WEBHOOKS_IN_FLIGHT.",
    )
    quota_artifacts = forms.IntegerField(
        required=False, min_value=0, help_text="Artifacts stored. Empty: QUOTA_ARTIFACTS."
    )
    quota_artifact_bytes = forms.IntegerField(
        required=False,
        min_value=0,
        help_text="Bytes of artifacts stored. Empty: QUOTA_ARTIFACT_BYTES.",
    )
    quota_parked_waits = forms.IntegerField(
        required=False,
        min_value=0,
        help_text="Wait steps parked on their timers at once. Empty: QUOTA_PARKED_WAITS.",
    )

    class Meta:
        model = Organization
        fields = ("name",)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.instance.pk:
            self.fields["webhook_url"].initial = self.instance.escalation_webhook_url
            self.fields["oncall_emails"].initial = "\n".join(self.instance.oncall_emails)
            for field in quotas.FIELDS:
                self.fields[field].initial = getattr(self.instance, field)

    def clean_oncall_emails(self) -> list[str]:
        raw = self.cleaned_data.get("oncall_emails", "")
        addresses = [part.strip() for part in raw.replace(",", "\n").splitlines() if part.strip()]
        validator = forms.EmailField()
        return [validator.clean(address) for address in addresses]

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        has_secret = bool(self.instance.pk and self.instance.escalation_webhook_secret)
        keeps_secret = has_secret and not data.get("clear_webhook_secret")
        if data.get("webhook_url") and not (data.get("webhook_secret") or keeps_secret):
            self.add_error("webhook_secret", "a webhook needs a signing secret")
        return data


@admin.register(Organization)
class OrganizationAdmin(admin.ModelAdmin[Organization]):
    form = OrganizationForm
    list_display: tuple[str, ...] = ("name", "id", "credits_available", "webhook", "created_at")
    search_fields = ("name", "=id")
    readonly_fields: ClassVar[tuple[str, ...]] = (
        "id",
        "created_at",
        "credits_available",
        "credits_reserved",
        "credits_spent",
    )
    fieldsets: ClassVar[tuple[Any, ...]] = (
        (None, {"fields": ("name", *readonly_fields)}),
        (
            "On-call (escalations)",
            {"fields": ("webhook_url", "webhook_secret", "clear_webhook_secret", "oncall_emails")},
        ),
        ("Quotas (docs/tenants.md); empty: the setting", {"fields": quotas.FIELDS}),
    )
    inlines = (ApiKeyInline,)
    actions: tuple[str, ...] = ("grant_credits",)

    @admin.display(description="escalation webhook", boolean=True)
    def webhook(self, organization: Organization) -> bool:
        return bool(organization.escalation_webhook_url)

    def save_model(self, request: HttpRequest, obj: Organization, form: Any, change: bool) -> None:
        super().save_model(request, obj, form, change)
        data = form.cleaned_data
        secret = data.get("webhook_secret") or None
        if data.get("clear_webhook_secret") and not secret:
            secret = ""
        oncall_set(
            organization=obj,
            webhook_url=data.get("webhook_url", ""),
            webhook_secret=secret,
            emails=data.get("oncall_emails", []),
        )
        quotas.quotas_set(
            obj.pk,
            actor=actor_of(request),
            **{name: data.get(field) for name, (field, _, _) in quotas.QUOTAS.items()},
        )

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description="credits reserved (held by unsettled runs)")
    def credits_reserved(self, organization: Organization) -> Decimal:
        return organization_balance(organization).reserved

    @admin.display(description="credits spent")
    def credits_spent(self, organization: Organization) -> Decimal:
        return organization_balance(organization).spent

    @admin.action(description="Grant credits to selected organizations")
    def grant_credits(
        self, request: HttpRequest, queryset: QuerySet[Organization]
    ) -> HttpResponse | None:
        if "apply" in request.POST:
            form = GrantCreditsForm(request.POST)
            if form.is_valid():
                for organization in queryset:
                    credits_grant(
                        organization=organization,
                        amount=form.cleaned_data["amount"],
                        reason=form.cleaned_data["reason"],
                        idempotency_key=f"{form.cleaned_data['idempotency_key']}:{organization.pk}",
                        actor=actor_of(request),
                    )
                self.message_user(
                    request,
                    f"granted {form.cleaned_data['amount']} credits to {queryset.count()} "
                    "organization(s)",
                )
                return None
        else:
            form = GrantCreditsForm(initial={"idempotency_key": uuid.uuid4()})
        return TemplateResponse(
            request,
            "admin/billing/grant_credits.html",
            {**self.admin_site.each_context(request), "form": form, "organizations": queryset},
        )


@admin.register(LedgerEntry)
class LedgerEntryAdmin(ReadOnlyAdminMixin, admin.ModelAdmin[LedgerEntry]):
    """The ledger, read-only: entries are written by the billing services alone."""

    list_display = (
        "created_at",
        "organization",
        "type",
        "amount",
        "run",
        "step",
        "reason",
        "actor",
    )
    list_filter = ("type", "organization", "created_at")
    list_select_related = ("organization", "run", "step")
    search_fields = ("=run__id", "idempotency_key", "reason")
    show_full_result_count = False


@admin.register(Reservation)
class ReservationAdmin(ReadOnlyAdminMixin, admin.ModelAdmin[Reservation]):
    """Credits held per run attempt, read-only: written by the billing services alone."""

    list_display = (
        "created_at",
        "organization",
        "run_id",
        "attempt_number",
        "reserved",
        "charged",
        "refunded",
        "settled_at",
    )
    list_filter = ("organization", ("settled_at", admin.EmptyFieldListFilter))
    list_select_related = ("organization",)
    search_fields = ("=run_id",)
    show_full_result_count = False


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin[ApiKey]):
    list_display = (
        "name",
        "prefix",
        "scope",
        "organization",
        "created_at",
        "last_used_at",
        "revoked_at",
    )
    list_filter = ("scope", "revoked_at")
    list_select_related = ("organization",)
    search_fields = ("name", "prefix", "organization__name")
    actions = ("revoke",)

    def get_fields(self, request: HttpRequest, obj: ApiKey | None = None) -> tuple[str, ...]:
        if obj is None:
            return ("organization", "name", "scope")
        return (
            "organization",
            "name",
            "scope",
            "prefix",
            "created_at",
            "last_used_at",
            "revoked_at",
        )

    def get_form(
        self, request: HttpRequest, obj: ApiKey | None = None, change: bool = False, **kwargs: Any
    ) -> type[ModelForm[ApiKey]]:
        form = super().get_form(request, obj, change, **kwargs)
        if obj is None and "scope" in form.base_fields:
            form.base_fields["scope"].required = False  # left empty: a full key, as before
        return form

    def get_readonly_fields(
        self, request: HttpRequest, obj: ApiKey | None = None
    ) -> tuple[str, ...]:
        if obj is None:
            return ()
        # A key's scope is chosen once: widening it would hand more power to whoever
        # already holds it. Issue a new key instead.
        return ("organization", "scope", "prefix", "created_at", "last_used_at", "revoked_at")

    def save_model(
        self, request: HttpRequest, obj: ApiKey, form: ModelForm[ApiKey], change: bool
    ) -> None:
        if change:
            obj.save(update_fields=["name"])
            return
        created, raw_key = api_key_create(
            organization=obj.organization, name=obj.name, scope=obj.scope or ApiKeyScope.FULL
        )
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


class SecretForm(forms.ModelForm[Secret]):
    # Write-only: never rendered back, never prefilled (render_value=False).
    value = forms.CharField(
        required=False,
        strip=False,
        widget=forms.PasswordInput(render_value=False),
        help_text="Stored encrypted and never shown again. When changing a secret, leave "
        "empty to keep the current value.",
    )

    class Meta:
        model = Secret
        fields = ("organization", "name")

    def clean_name(self) -> str:
        name = str(self.cleaned_data["name"])
        if not is_valid_secret_name(name):
            raise forms.ValidationError(
                "A letter or _, then letters, digits or _ (at most 100 characters)."
            )
        return name


@admin.register(Secret)
class SecretAdmin(admin.ModelAdmin[Secret]):
    """Names and dates only; a value is written through ``secret_put`` and never shown."""

    form = SecretForm
    list_display = ("name", "organization", "created_at", "updated_at")
    list_filter = ("organization",)
    list_select_related = ("organization",)
    search_fields = ("name", "organization__name")

    def get_queryset(self, request: HttpRequest) -> QuerySet[Secret]:
        return super().get_queryset(request).defer("value_encrypted")

    def get_fields(self, request: HttpRequest, obj: Secret | None = None) -> tuple[str, ...]:
        if obj is None:
            return ("organization", "name", "value")
        return ("organization", "name", "value", "created_at", "updated_at")

    def get_readonly_fields(
        self, request: HttpRequest, obj: Secret | None = None
    ) -> tuple[str, ...]:
        # Another name or organization is another secret: add it, delete this one.
        return () if obj is None else ("organization", "name", "created_at", "updated_at")

    def save_model(
        self, request: HttpRequest, obj: Secret, form: ModelForm[Secret], change: bool
    ) -> None:
        value = form.cleaned_data.get("value") or ""
        if change and not value:
            return  # nothing else is editable: the value is kept
        saved, _ = secret_put(organization=obj.organization, name=obj.name, value=value)
        obj.pk = saved.pk
        obj.created_at, obj.updated_at = saved.created_at, saved.updated_at
        obj._state.adding = False

    def delete_model(self, request: HttpRequest, obj: Secret) -> None:
        secret_delete(organization=obj.organization, name=obj.name)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Secret]) -> None:
        for secret in queryset.select_related("organization"):
            secret_delete(organization=secret.organization, name=secret.name)
