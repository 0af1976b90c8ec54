"""The organization's page as billing draws it, with what runs adds: its limits (set
through ``runs.admission.limits_set``) and how much of them is in use
(docs/fairness.md)."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from billing.admin import OrganizationAdmin, OrganizationForm
from billing.models import Organization
from runs import admission, fairness
from runs.admin.controls import actor_of


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
            for name in admission.LIMIT_FIELDS:
                self.fields[name].initial = getattr(self.instance, name)


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
        "created_at",
    )
    readonly_fields = (
        *OrganizationAdmin.readonly_fields,
        "runs_running",
        "runs_queued",
        "steps_executing",
    )
    fieldsets = (
        *OrganizationAdmin.fieldsets,
        (
            "Limits and fair share (docs/fairness.md)",
            {
                "fields": (
                    *admission.LIMIT_FIELDS,
                    "runs_running",
                    "runs_queued",
                    "steps_executing",
                )
            },
        ),
    )

    def get_queryset(self, request: HttpRequest) -> QuerySet[Organization]:
        return fairness.with_load(super().get_queryset(request))

    def save_model(self, request: HttpRequest, obj: Organization, form: Any, change: bool) -> None:
        super().save_model(request, obj, form, change)
        data = form.cleaned_data
        admission.limits_set(
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


admin.site.unregister(Organization)
admin.site.register(Organization, OrganizationLoadAdmin)
