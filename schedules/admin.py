"""Operators' view of run schedules: each with its next and last due time and last run;
pause, resume and trigger through the services the API calls. Schedules are written
through the API or the CLI (their plan and timing are validated there), never edited
here; their fires are a read-only history."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from billing.services import InsufficientCredits
from common.admin import ReadOnlyAdminMixin, actor_of
from common.units import duration_text, time_in_zone
from runs.admission.run_admission import TooManyPendingRuns
from runs.plan import PlanInvalid
from schedules import services
from schedules.models import Schedule, ScheduleFire, ScheduleStatus
from schedules.selectors import with_last_run

RECENT_FIRES = 20
REFUSALS = (InsufficientCredits, TooManyPendingRuns, PlanInvalid, services.ScheduleNotFound)


def _run_link(run_id: Any, status: str | None) -> SafeString | str:
    if run_id is None:
        return "-"
    url = reverse("admin:runs_run_change", args=[run_id])
    return format_html('<a href="{}">{}</a> ({})', url, run_id, status or "?")


@admin.register(Schedule)
class ScheduleAdmin(ReadOnlyAdminMixin, admin.ModelAdmin[Schedule]):
    list_display = (
        "name",
        "organization",
        "state",
        "cadence",
        "next_due",
        "last_due",
        "last_run",
        "overlap",
        "catchup",
    )
    list_filter = ("paused_reason", "overlap", "catchup", "timezone", "created_at")
    list_select_related = ("organization",)
    search_fields = ("=id", "name")
    ordering = ("next_due_at",)
    show_full_result_count = False
    actions = ("pause_schedules", "resume_schedules", "trigger_schedules")
    fields = (
        "id",
        "name",
        "organization",
        "state",
        "cadence",
        "timezone",
        "start_at",
        "end_at",
        "overlap",
        "catchup",
        "next_due",
        "last_due",
        "last_run",
        "paused_at",
        "paused_reason",
        "credit_refusals",
        "variables",
        "plan",
        "created_by",
        "created_at",
        "updated_at",
        "recent_fires",
    )
    readonly_fields = fields

    def get_queryset(self, request: HttpRequest) -> QuerySet[Schedule]:
        return with_last_run(super().get_queryset(request))

    @admin.display(description="status")
    def state(self, schedule: Schedule) -> str:
        """Paused, with why: `paused (insufficient_credits)` is one that paused itself."""
        if schedule.status == ScheduleStatus.PAUSED and schedule.paused_reason:
            return f"paused ({schedule.paused_reason})"
        return schedule.status

    @admin.display(description="when")
    def cadence(self, schedule: Schedule) -> str:
        if schedule.interval_ms:
            return f"every {duration_text(schedule.interval_ms)}"
        return f"cron {schedule.cron} ({schedule.timezone})"

    @admin.display(description="next due", ordering="next_due_at")
    def next_due(self, schedule: Schedule) -> str:
        """In the schedule's zone, named; none while paused (resuming computes it again)."""
        if schedule.status == ScheduleStatus.PAUSED:
            return "paused"
        if schedule.next_due_at is None:
            return "none (ended)"
        return time_in_zone(schedule.next_due_at, schedule.timezone)

    @admin.display(description="last due", ordering="last_due_at")
    def last_due(self, schedule: Schedule) -> str:
        return time_in_zone(schedule.last_due_at, schedule.timezone)

    @admin.display(description="last run")
    def last_run(self, schedule: Schedule) -> SafeString | str:
        return _run_link(
            getattr(schedule, "last_run_id", None), getattr(schedule, "last_run_status", None)
        )

    @admin.display(description=f"latest {RECENT_FIRES} fires")
    def recent_fires(self, schedule: Schedule) -> SafeString:
        fires = (
            ScheduleFire.objects.filter(schedule=schedule)
            .select_related("run")
            .order_by("-id")[:RECENT_FIRES]
        )
        rows = format_html_join(
            "",
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            (
                (
                    time_in_zone(fire.due_at, schedule.timezone, seconds=True),
                    fire.kind,
                    fire.status,
                    fire.reason or fire.message,
                    _run_link(fire.run_id, fire.run.status if fire.run else None),
                )
                for fire in fires
            ),
        )
        return format_html(
            "<table><tr><th>due</th><th>kind</th><th>status</th><th>reason</th>"
            "<th>run</th></tr>{}</table>",
            rows,
        )

    def _each(
        self,
        request: HttpRequest,
        queryset: QuerySet[Schedule],
        verb: str,
        act: Callable[[Schedule, str], Any],
    ) -> None:
        actor, done = actor_of(request), 0
        for schedule in queryset:
            try:
                act(schedule, actor)
                done += 1
            except REFUSALS as exc:
                self.message_user(request, f"{schedule.name}: {exc}", messages.ERROR)
        if done:
            self.message_user(request, f"{verb}: {done} schedule(s)")

    @admin.action(description="Pause selected schedules")
    def pause_schedules(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        self._each(
            request,
            queryset,
            "paused",
            lambda schedule, _actor: services.schedule_pause(schedule_id=schedule.pk),
        )

    @admin.action(description="Resume selected schedules")
    def resume_schedules(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        self._each(
            request,
            queryset,
            "resumed",
            lambda schedule, _actor: services.schedule_resume(schedule_id=schedule.pk),
        )

    @admin.action(description="Run selected schedules now")
    def trigger_schedules(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        self._each(
            request,
            queryset,
            "triggered",
            lambda schedule, actor: services.schedule_trigger(schedule_id=schedule.pk, actor=actor),
        )


@admin.register(ScheduleFire)
class ScheduleFireAdmin(ReadOnlyAdminMixin, admin.ModelAdmin[ScheduleFire]):
    """Every due time handled and every trigger: fired with its run, or skipped and why."""

    list_display = ("due_at", "schedule", "kind", "status", "reason", "run", "created_at")
    list_filter = ("status", "reason", "kind", "due_at")
    list_select_related = ("schedule", "run")
    search_fields = ("=schedule__id", "=run__id", "schedule__name")
    ordering = ("-id",)
    show_full_result_count = False
    raw_id_fields = ("schedule", "run")
