"""What steps wait on outside the worker, in the admin: runners and their jobs
(docs/runners.md), callback and poll waits."""

from __future__ import annotations

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from common.admin import ReadOnlyAdminMixin
from runs import runners
from runs.models import Runner, RunnerJob, StepWait
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
        "registered_at",
    )
    list_filter = ("executor_type",)
    search_fields = ("=id", "hostname", "project_dir")
    list_select_related = ("organization",)
    ordering = ("organization", "hostname", "project_dir")

    @admin.display(description="status")
    def status(self, runner: Runner) -> str:
        return runners.runner_status(runner)


@admin.register(RunnerJob)
class RunnerJobAdmin(ReadOnlyAdminMixin, admin.ModelAdmin[RunnerJob]):
    """Runner jobs, one per attempt of a `runner` step; stopping one goes through the
    service the API uses."""

    list_display = (
        "id",
        "run",
        "step",
        "attempt",
        "status",
        "runner",
        "created_at",
        "claimed_at",
        "completed_at",
    )
    list_filter = ("status", "created_at")
    list_select_related = ("run", "step", "runner")
    search_fields = ("=id", "=run__id", "=session_id")
    ordering = ("-created_at",)
    show_full_result_count = False
    actions = ("stop_jobs",)

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
