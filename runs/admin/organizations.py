"""An organization's page with what runs adds to billing's: its limits (with their use)
and its suspension, and the rate limits on its tools (``runs.admission``,
``runs.people.suspension``). The organization's admin is billing's, extended and
registered again here because billing sits below runs and cannot import them. Every
action goes through the services."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse

from billing.admin import OrganizationAdmin, OrganizationForm
from billing.models import Organization
from common.admin import actor_of
from common.units import duration_text
from ratelimits.models import RateLimit
from runs.admission import fairness, run_admission, step_admission
from runs.models import (
    Step,
)
from runs.people import suspension


class OrganizationLimitsForm(OrganizationForm):
    max_running_runs = forms.IntegerField(
        required=False,
        min_value=1,
        help_text="Runs running at once; more wait (PENDING, with a queued reason). "
        "Empty: ORG_MAX_RUNNING_RUNS.",
    )
    max_running_steps = forms.IntegerField(
        required=False,
        min_value=1,
        help_text="Steps executing at once across its runs. Empty: ORG_MAX_RUNNING_STEPS.",
    )
    max_pending_runs = forms.IntegerField(
        required=False,
        min_value=1,
        help_text="Runs waiting to start; one more is refused (429). Empty: ORG_MAX_PENDING_RUNS.",
    )
    share = forms.IntegerField(
        required=False,
        min_value=1,
        max_value=1000,
        initial=1,
        help_text="Its weight when organizations share the workers (2: twice the share of "
        "1). Empty: 1.",
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.instance.pk:
            for name in run_admission.LIMIT_FIELDS:
                self.fields[name].initial = getattr(self.instance, name)


class SuspendForm(forms.Form):
    reason = forms.CharField(
        required=False,
        max_length=suspension.REASON_MAX_LENGTH,
        widget=forms.Textarea(attrs={"rows": 3}),
        help_text="Why, for operators: never shown to the organization.",
    )


class OrganizationLoadAdmin(OrganizationAdmin):
    form = OrganizationLimitsForm
    list_display = (
        "name",
        "id",
        "credits_available",
        "runs_running",
        "runs_queued",
        "steps_executing",
        "webhook",
        "suspended",
        "created_at",
    )
    list_filter = (("suspended_at", admin.EmptyFieldListFilter),)
    readonly_fields = (
        *OrganizationAdmin.readonly_fields,
        "runs_running",
        "runs_queued",
        "steps_executing",
        "suspended_at",
        "suspended_reason",
    )
    actions = (*OrganizationAdmin.actions, "suspend", "unsuspend")
    fieldsets = (
        *OrganizationAdmin.fieldsets,
        (
            "Limits and fair share (docs/fairness.md)",
            {
                "fields": (
                    *run_admission.LIMIT_FIELDS,
                    "runs_running",
                    "runs_queued",
                    "steps_executing",
                )
            },
        ),
        (
            "Suspension (docs/tenants.md): use the actions of the list",
            {"fields": ("suspended_at", "suspended_reason")},
        ),
    )

    def get_queryset(self, request: HttpRequest) -> QuerySet[Organization]:
        return fairness.with_load(super().get_queryset(request))

    def save_model(self, request: HttpRequest, obj: Organization, form: Any, change: bool) -> None:
        super().save_model(request, obj, form, change)
        data = form.cleaned_data
        run_admission.limits_set(
            obj.pk,
            actor=actor_of(request),
            max_running_runs=data.get("max_running_runs"),
            max_running_steps=data.get("max_running_steps"),
            max_pending_runs=data.get("max_pending_runs"),
            share=data.get("share") or 1,
        )

    @admin.display(description="runs running", ordering="runs_running")
    def runs_running(self, organization: Organization) -> int:
        return int(getattr(organization, "runs_running", 0))

    @admin.display(description="runs queued", ordering="runs_queued")
    def runs_queued(self, organization: Organization) -> int:
        return int(getattr(organization, "runs_queued", 0))

    @admin.display(description="steps executing")
    def steps_executing(self, organization: Organization) -> int:
        return int(getattr(organization, "steps_executing", 0))

    @admin.display(description="suspended", boolean=True, ordering="suspended_at")
    def suspended(self, organization: Organization) -> bool:
        return organization.suspended_at is not None

    @admin.action(description="Suspend selected organizations (keys refused, runs paused)")
    def suspend(
        self, request: HttpRequest, queryset: QuerySet[Organization]
    ) -> HttpResponse | None:
        if "apply" not in request.POST:
            form = SuspendForm()
        else:
            form = SuspendForm(request.POST)
            if form.is_valid():
                paused = 0
                for organization in queryset:
                    done = suspension.organization_suspend(
                        organization=organization,
                        reason=form.cleaned_data["reason"],
                        actor=actor_of(request),
                    )
                    paused += len(done.runs)
                self.message_user(
                    request,
                    f"{queryset.count()} organization(s) suspended; {paused} running run(s) paused",
                )
                return None
        return TemplateResponse(
            request,
            "admin/runs/suspend_organizations.html",
            {**self.admin_site.each_context(request), "form": form, "organizations": queryset},
        )

    @admin.action(description="Unsuspend selected organizations (resume what it paused)")
    def unsuspend(self, request: HttpRequest, queryset: QuerySet[Organization]) -> None:
        resumed = 0
        for organization in queryset:
            done = suspension.organization_unsuspend(
                organization=organization, actor=actor_of(request)
            )
            resumed += len(done.runs)
        self.message_user(
            request,
            f"{queryset.count()} organization(s) unsuspended; {resumed} run(s) the "
            "suspension paused resumed",
        )


admin.site.unregister(Organization)
admin.site.register(Organization, OrganizationLoadAdmin)


@admin.register(RateLimit)
class RateLimitAdmin(admin.ModelAdmin[RateLimit]):
    """Organizations' limits and the operators' global limits on a tool (no organization,
    a tool named): saving or deleting one re-plans the steps waiting for it
    (``runs.admission.step_admission``), as the API does."""

    list_display = ("name", "organization", "tool", "limit", "period", "waiting", "updated_at")
    list_filter = ("organization",)
    search_fields = ("name", "tool")
    fields = ("organization", "name", "tool", "limit", "period_ms")

    @admin.display(description="period", ordering="period_ms")
    def period(self, limit: RateLimit) -> str:
        return duration_text(limit.period_ms)

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
