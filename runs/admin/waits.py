"""What steps wait on outside the worker, in the admin: runners and their jobs, the
published tools they offer, and callback and poll waits (``runs.waits``). Read-only."""

from __future__ import annotations

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from common.admin import ReadOnlyAdminMixin
from runs.models import (
    PublishedTool,
    Runner,
    RunnerJob,
    StepWait,
)
from runs.states import InvalidTransition
from runs.waits import runners


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
