"""Operators' view of run webhooks: endpoints with their state (disabled ones first, with
why), deliveries with every attempt; actions to enable, disable or ping an endpoint and
to send deliveries again, each calling the service the API calls. Endpoints are written
through the API (their secret is shown once there), never edited here. Deliveries an
action makes due are sent by beat's next webhook sweep (within WEBHOOK_SWEEP_INTERVAL)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from common.admin import ReadOnlyAdminMixin, shortened
from common.units import duration_text, time_in_zone
from webhooks import services
from webhooks.models import WebhookAttempt, WebhookDelivery, WebhookEndpoint


def _each(
    model_admin: admin.ModelAdmin[Any],
    request: HttpRequest,
    queryset: QuerySet[Any],
    verb: str,
    act: Callable[[Any], Any],
) -> None:
    done = 0
    for row in queryset:
        try:
            act(row)
            done += 1
        except (services.EndpointNotFound, services.DeliveryNotFound) as exc:
            model_admin.message_user(request, f"{row}: not found ({exc})", messages.ERROR)
        except services.TooManyPendingDeliveries as exc:
            model_admin.message_user(request, f"{row}: {exc}", messages.ERROR)
    if done:
        model_admin.message_user(request, f"{verb}: {done}")


@admin.register(WebhookEndpoint)
class WebhookEndpointAdmin(ReadOnlyAdminMixin, admin.ModelAdmin[WebhookEndpoint]):
    list_display = (
        "short_url",
        "organization",
        "enabled",
        "disabled_reason",
        "consecutive_failures",
        "failing_since",
        "last_delivered_at",
    )
    list_filter = ("enabled", "created_at")
    list_select_related = ("organization",)
    search_fields = ("=id", "url", "=organization__id")
    ordering = ("enabled", "-created_at")
    show_full_result_count = False
    actions = ("enable_endpoints", "disable_endpoints", "test_endpoints")
    fields = (
        "id",
        "organization",
        "url",
        "events",
        "description",
        "enabled",
        "disabled_at",
        "disabled_reason",
        "consecutive_failures",
        "failing_since",
        "last_delivered_at",
        "created_by",
        "created_at",
        "updated_at",
    )
    readonly_fields = fields

    @admin.display(description="URL", ordering="url")
    def short_url(self, endpoint: WebhookEndpoint) -> SafeString | str:
        return shortened(endpoint.url)

    @admin.action(description="Enable selected endpoints (their failures forgotten)")
    def enable_endpoints(self, request: HttpRequest, queryset: QuerySet[WebhookEndpoint]) -> None:
        _each(
            self,
            request,
            queryset,
            "enabled",
            lambda endpoint: services.endpoint_update(endpoint_id=endpoint.pk, enabled=True),
        )

    @admin.action(description="Disable selected endpoints")
    def disable_endpoints(self, request: HttpRequest, queryset: QuerySet[WebhookEndpoint]) -> None:
        _each(
            self,
            request,
            queryset,
            "disabled",
            lambda endpoint: services.endpoint_update(endpoint_id=endpoint.pk, enabled=False),
        )

    @admin.action(description="Send a test delivery to selected endpoints")
    def test_endpoints(self, request: HttpRequest, queryset: QuerySet[WebhookEndpoint]) -> None:
        _each(
            self,
            request,
            queryset,
            "test deliveries queued",
            lambda endpoint: services.endpoint_test(endpoint_id=endpoint.pk),
        )


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(ReadOnlyAdminMixin, admin.ModelAdmin[WebhookDelivery]):
    list_display = (
        "uid",
        "endpoint_url",
        "event_type",
        "status",
        "attempts",
        "last_status_code",
        "next_attempt_at",
        "created_at",
    )
    list_filter = ("status", "event_type", "created_at")
    list_select_related = ("endpoint",)
    search_fields = ("=uid", "=run__id", "=endpoint__id")
    ordering = ("-id",)
    show_full_result_count = False
    raw_id_fields = ("endpoint", "run")
    actions = ("redeliver",)
    fields = (
        "uid",
        "endpoint",
        "run",
        "event_type",
        "status",
        "attempts",
        "next_attempt_at",
        "retry_until",
        "lease_until",
        "last_status_code",
        "last_error",
        "delivered_at",
        "created_at",
        "payload",
        "attempt_table",
    )
    readonly_fields = fields

    @admin.display(description="endpoint", ordering="endpoint__url")
    def endpoint_url(self, delivery: WebhookDelivery) -> SafeString | str:
        return shortened(delivery.endpoint.url)

    @admin.display(description="attempts made")
    def attempt_table(self, delivery: WebhookDelivery) -> SafeString:
        rows = format_html_join(
            "",
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            (
                (
                    a.number,
                    time_in_zone(a.created_at, seconds=True),
                    a.status_code or "-",
                    duration_text(a.duration_ms),
                    a.error or "ok",
                )
                for a in WebhookAttempt.objects.filter(delivery=delivery).order_by("number")
            ),
        )
        return format_html(
            "<table><tr><th>#</th><th>at</th><th>status</th><th>latency</th><th>error</th>"
            "</tr>{}</table>",
            rows,
        )

    @admin.action(description="Send selected deliveries again")
    def redeliver(self, request: HttpRequest, queryset: QuerySet[WebhookDelivery]) -> None:
        _each(
            self,
            request,
            queryset,
            "due again",
            lambda delivery: services.delivery_redeliver(delivery_uid=delivery.uid),
        )
