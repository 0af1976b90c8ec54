"""What runs and steps wait on, in the admin: runners and their jobs, callback and poll
waits, people (escalations, re-plans), an organization's limits (on billing's page of it,
with their use) and its suspension, and rate limits. Every action goes through the API's
services."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse

from billing.admin import OrganizationAdmin, OrganizationForm
from billing.models import Organization
from billing.services import InsufficientCredits
from common.admin import ReadOnlyAdminMixin, actor_of
from common.units import duration_text
from ratelimits.models import RateLimit
from runs import admission, escalations, fairness, runners, services, step_admission, suspension
from runs.models import (
    EscalationTicket,
    Notification,
    PublishedTool,
    Replan,
    Resolution,
    Runner,
    RunnerJob,
    Step,
    StepWait,
)
from runs.states import InvalidTransition


@admin.register(Runner)
class RunnerAdmin(ReadOnlyAdminMixin, admin.ModelAdmin[Runner]):
    """Registered runners (docs/runners.md): online, stale or deregistered."""

    list_display = (
        "id",
        "organization",
        "hostname",
        "project_dir",
        "executor_type",
        "status",
        "last_heartbeat",
    )
    list_filter = ("executor_type",)
    search_fields = ("=id", "hostname", "project_dir")
    list_select_related = ("organization",)
    ordering = ("organization", "hostname", "project_dir")

    @admin.display(description="status")
    def status(self, runner: Runner) -> str:
        return runners.runner_status(runner)


@admin.register(PublishedTool)
class PublishedToolAdmin(ReadOnlyAdminMixin, admin.ModelAdmin[PublishedTool]):
    """The catalogue (docs/tools.md): each version of a tool the fleet or an
    organization's workers published, with its schemas; read only (published by them)."""

    list_display = ("name", "version", "placement", "organization", "published_at")
    list_filter = ("placement",)
    search_fields = ("name",)
    list_select_related = ("organization",)
    ordering = ("name", "-published_at")


@admin.register(RunnerJob)
class RunnerJobAdmin(ReadOnlyAdminMixin, admin.ModelAdmin[RunnerJob]):
    """Runner jobs, one per attempt of a `runner` step; stopping one goes through the
    service the API uses."""

    list_display = (
        "id",
        "run",
        "step",
        "attempt",
        "tool",
        "status",
        "runner_where",
        "created_at",
        "completed_at",
    )
    list_filter = ("status", "tool", "created_at")
    list_select_related = ("run", "step", "runner")
    search_fields = ("=id", "=run__id", "=session_id")
    ordering = ("-created_at",)
    show_full_result_count = False
    actions = ("stop_jobs",)

    @admin.display(description="runner", ordering="runner__hostname")
    def runner_where(self, job: RunnerJob) -> str:
        """Where the job runs, not the runner's 28-character id (on the job's page), which
        cannot wrap and would widen the list past the screen."""
        runner = job.runner
        return "-" if runner is None else f"{runner.hostname} {runner.project_dir}"

    @admin.action(description="Stop selected runner jobs")
    def stop_jobs(self, request: HttpRequest, queryset: QuerySet[RunnerJob]) -> None:
        stopped = 0
        for job in queryset:
            try:
                runners.stop_job(organization=job.organization, job_id=job.pk)
                stopped += 1
            except InvalidTransition as exc:
                self.message_user(request, f"job {job.pk}: {exc}", messages.ERROR)
        if stopped:
            self.message_user(request, f"stopping: {stopped} job(s)")


@admin.register(StepWait)
class StepWaitAdmin(ReadOnlyAdminMixin, admin.ModelAdmin[StepWait]):
    """Callback and poll waits, one per attempt of a `callback` or `poll` step."""

    list_display = ("id", "kind", "run", "step", "attempt", "status", "polls", "expires_at")
    list_filter = ("kind", "status", "created_at")
    list_select_related = ("run", "step")
    search_fields = ("=id", "=run__id")
    ordering = ("-created_at",)
    show_full_result_count = False
    exclude = ("token_digest",)


class NotificationInline(admin.TabularInline[Notification, EscalationTicket]):
    model = Notification
    extra = 0
    can_delete = False
    fields = ("created_at", "channel", "attempt", "target", "delivered", "status_code", "error")
    readonly_fields = fields

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(EscalationTicket)
class EscalationTicketAdmin(ReadOnlyAdminMixin, admin.ModelAdmin[EscalationTicket]):
    """Runs handed to people (docs/escalation.md): acknowledge, then resolve with an
    action, through the services the API calls."""

    list_display = (
        "opened_at",
        "run",
        "organization",
        "reason",
        "severity",
        "status",
        "resolution",
        "notified_at",
    )
    list_filter = ("status", "reason", "severity", "resolution", "opened_at")
    list_select_related = ("run", "organization")
    search_fields = ("=id", "=run__id")
    ordering = ("-opened_at",)
    show_full_result_count = False
    inlines = (NotificationInline,)
    actions = (
        "acknowledge",
        "resolve_resume",
        "resolve_retry",
        "resolve_replan",
        "resolve_cancel",
    )

    def _each(
        self,
        request: HttpRequest,
        queryset: QuerySet[EscalationTicket],
        verb: str,
        act: Callable[[EscalationTicket, str], Any],
    ) -> None:
        actor = actor_of(request)
        done = 0
        for ticket in queryset:
            try:
                act(ticket, actor)
                done += 1
            except (
                InvalidTransition,
                services.AttemptsExhausted,
                InsufficientCredits,
                escalations.EscalationResolved,
                escalations.ReplanLimitReached,
            ) as exc:
                self.message_user(request, f"escalation {ticket.pk}: {exc}", messages.ERROR)
        if done:
            self.message_user(request, f"{verb}: {done} escalation(s)")

    @admin.action(description="Acknowledge selected escalations")
    def acknowledge(self, request: HttpRequest, queryset: QuerySet[EscalationTicket]) -> None:
        self._each(
            request,
            queryset,
            "acknowledged",
            lambda ticket, actor: escalations.escalation_acknowledge(
                ticket_id=ticket.pk, actor=actor
            ),
        )

    def _resolve(
        self, request: HttpRequest, queryset: QuerySet[EscalationTicket], action: str
    ) -> None:
        self._each(
            request,
            queryset,
            f"resolved ({action})",
            lambda ticket, actor: escalations.escalation_resolve(
                ticket_id=ticket.pk, action=action, actor=actor
            ),
        )

    @admin.action(description="Resolve: resume (failed steps retried afresh)")
    def resolve_resume(self, request: HttpRequest, queryset: QuerySet[EscalationTicket]) -> None:
        self._resolve(request, queryset, Resolution.RESUME)

    @admin.action(description="Resolve: retry (a new attempt of the run)")
    def resolve_retry(self, request: HttpRequest, queryset: QuerySet[EscalationTicket]) -> None:
        self._resolve(request, queryset, Resolution.RETRY)

    @admin.action(description="Resolve: re-plan the failing agents")
    def resolve_replan(self, request: HttpRequest, queryset: QuerySet[EscalationTicket]) -> None:
        self._resolve(request, queryset, Resolution.REPLAN)

    @admin.action(description="Resolve: cancel the run (and refund)")
    def resolve_cancel(self, request: HttpRequest, queryset: QuerySet[EscalationTicket]) -> None:
        self._resolve(request, queryset, Resolution.CANCEL)


@admin.register(Replan)
class ReplanAdmin(ReadOnlyAdminMixin, admin.ModelAdmin[Replan]):
    """Re-plans: what failed, what the planner proposed, what came of it."""

    list_display = (
        "requested_at",
        "run",
        "number",
        "trigger",
        "planner",
        "status",
        "agents",
        "cost",
        "finished_at",
    )
    list_filter = ("status", "trigger", "planner", "requested_at")
    list_select_related = ("run",)
    search_fields = ("=run__id",)
    ordering = ("-requested_at",)
    show_full_result_count = False


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
                    *admission.LIMIT_FIELDS,
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
    (``runs.step_admission``), as the API does."""

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
