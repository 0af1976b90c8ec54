"""What people decide, in the admin: escalation tickets (acknowledge, resolve, with their
notifications) and re-plans (``runs.people``). Every action goes through the services."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from billing.services import InsufficientCredits
from common.admin import ReadOnlyAdminMixin, actor_of
from runs import services
from runs.models import (
    EscalationTicket,
    Notification,
    Replan,
    Resolution,
)
from runs.people import escalations
from runs.states import InvalidTransition


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
