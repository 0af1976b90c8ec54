"""Run webhooks over HTTP (docs/webhooks.md): register, list, read, change and delete an
organization's endpoints; ping one; read its deliveries with every attempt; send a
delivery again. Every route is scoped to the key's organization (another organization's
endpoint is 404); writes need a `full` key. Each view validates its input's shape and
calls one function of ``webhooks.services`` or ``webhooks.selectors``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, ClassVar
from uuid import UUID

from django.urls import reverse
from drf_spectacular.utils import OpenApiExample, OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.exceptions import NotFound
from rest_framework.request import Request
from rest_framework.response import Response

from api.authentication import client_of, organization_of
from api.base import ApiView, page_response, validated
from api.errors import (
    LIST_ERRORS,
    READ_ERRORS,
    RETRY_AFTER_PARAMETER,
    WRITE_ERRORS,
    error_responses,
)
from api.idempotency import (
    IDEMPOTENCY_PARAMETER,
    REPLAYED_PARAMETER,
    idempotent,
    idempotent_sealing,
)
from api.pagination import PageQuery, paginated
from api.serializers import EmptyInput, InputSerializer, StrictBooleanField, StrictCharField
from webhooks import selectors, services
from webhooks.models import (
    DESCRIPTION_MAX_LENGTH,
    TEST_EVENT,
    URL_MAX_LENGTH,
    DeliveryStatus,
    EventType,
    WebhookDelivery,
    WebhookEndpoint,
)

TAG_WEBHOOKS = "webhooks"
POST_PARAMETERS = [IDEMPOTENCY_PARAMETER, REPLAYED_PARAMETER]
# The posts that queue a delivery by hand may be refused past the pending bound (429).
QUEUE_PARAMETERS = [*POST_PARAMETERS, RETRY_AFTER_PARAMETER]


@contextmanager
def _refusals() -> Iterator[None]:
    """The services' refusals as the API's: 404 `not_found`, 400 `invalid_request` with
    the field."""
    try:
        yield
    except (services.EndpointNotFound, services.DeliveryNotFound):
        raise NotFound("not found") from None
    except services.WebhookInvalid as exc:
        raise serializers.ValidationError({exc.field: [exc.message]}) from None


# --------------------------------------------------------------------------- inputs
class WebhookEndpointFields(InputSerializer):
    url = StrictCharField(
        max_length=URL_MAX_LENGTH,
        help_text="Where deliveries are POSTed: an http or https URL with a host. Not resolved "
        "here; the outbound address guard (HTTP_TOOL_ALLOWED_NETWORKS) judges it when sending.",
    )
    events = serializers.ListField(
        child=serializers.ChoiceField(choices=EventType.choices),
        allow_empty=False,
        max_length=len(EventType.values),
        help_text="The event types to deliver.",
    )
    secret = StrictCharField(
        required=False,
        write_only=True,
        trim_whitespace=False,
        min_length=services.SECRET_MIN_LENGTH,
        max_length=services.SECRET_MAX_LENGTH,
        help_text="The signing secret; one is generated when none is given. Shown once, in "
        "the answer to the create; never readable again.",
    )
    description = StrictCharField(
        required=False, allow_blank=True, max_length=DESCRIPTION_MAX_LENGTH
    )

    def validate_url(self, value: str) -> str:
        problem = services.url_problem(value)
        if problem:
            raise serializers.ValidationError(problem, code="invalid_url")
        return value


class WebhookEndpointCreateInput(WebhookEndpointFields):
    """A new endpoint: `url` and `events`; `secret` and `description` optional."""


class WebhookEndpointUpdateInput(WebhookEndpointFields):
    """The fields to change; the others keep theirs. `enabled: true` enables a disabled
    endpoint again (its failures forgotten, its pending deliveries sent)."""

    enabled = StrictBooleanField(required=False)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for field in self.fields.values():
            field.required = False


# --------------------------------------------------------------------------- outputs
class WebhookEndpointOutput(serializers.Serializer[Any]):
    id = serializers.UUIDField()
    url = serializers.CharField()
    events = serializers.ListField(child=serializers.ChoiceField(choices=EventType.choices))
    description = serializers.CharField()
    enabled = serializers.BooleanField()
    disabled_at = serializers.DateTimeField(allow_null=True)
    disabled_reason = serializers.CharField(
        help_text="Why it is disabled: by its organization, a 410 Gone answer, or failing "
        "for long; empty while enabled."
    )
    consecutive_failures = serializers.IntegerField(help_text="Attempts failed in a row.")
    failing_since = serializers.DateTimeField(allow_null=True)
    last_delivered_at = serializers.DateTimeField(allow_null=True)
    created_by = serializers.CharField()
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()


class WebhookEndpointCreatedOutput(WebhookEndpointOutput):
    secret = serializers.CharField(help_text="The signing secret: shown this once.")


class WebhookAttemptOutput(serializers.Serializer[Any]):
    number = serializers.IntegerField()
    status_code = serializers.IntegerField(
        allow_null=True, help_text="The answer's; null when none came (timeout, refused)."
    )
    ok = serializers.BooleanField()
    error = serializers.CharField()
    duration_ms = serializers.IntegerField(help_text="The attempt's latency.")
    created_at = serializers.DateTimeField()


class WebhookDeliveryOutput(serializers.Serializer[Any]):
    id = serializers.UUIDField(help_text="The body's `id` and X-Orchestrator-Delivery.")
    type = serializers.CharField(help_text=f"An event type, or `{TEST_EVENT}`.")
    status = serializers.ChoiceField(choices=DeliveryStatus.choices)
    run = serializers.UUIDField(allow_null=True)
    next_attempt_at = serializers.DateTimeField(help_text="When it is due, while pending.")
    last_status_code = serializers.IntegerField(allow_null=True)
    last_error = serializers.CharField()
    delivered_at = serializers.DateTimeField(allow_null=True)
    created_at = serializers.DateTimeField()
    attempts = WebhookAttemptOutput(many=True)


def endpoint_row(endpoint: WebhookEndpoint) -> dict[str, Any]:
    return {
        "id": endpoint.pk,
        "url": endpoint.url,
        "events": endpoint.events,
        "description": endpoint.description,
        "enabled": endpoint.enabled,
        "disabled_at": endpoint.disabled_at,
        "disabled_reason": endpoint.disabled_reason,
        "consecutive_failures": endpoint.consecutive_failures,
        "failing_since": endpoint.failing_since,
        "last_delivered_at": endpoint.last_delivered_at,
        "created_by": endpoint.created_by,
        "created_at": endpoint.created_at,
        "updated_at": endpoint.updated_at,
    }


def delivery_row(delivery: WebhookDelivery) -> dict[str, Any]:
    return {
        "id": delivery.uid,
        "type": delivery.event_type,
        "status": delivery.status,
        "run": delivery.run_id,
        "next_attempt_at": delivery.next_attempt_at,
        "last_status_code": delivery.last_status_code,
        "last_error": delivery.last_error,
        "delivered_at": delivery.delivered_at,
        "created_at": delivery.created_at,
        "attempts": [
            {
                "number": attempt.number,
                "status_code": attempt.status_code,
                "ok": attempt.ok,
                "error": attempt.error,
                "duration_ms": attempt.duration_ms,
                "created_at": attempt.created_at,
            }
            for attempt in delivery.attempt_records.all()
        ],
    }


EndpointPage = paginated(WebhookEndpointOutput, "PaginatedWebhookEndpointList")
DeliveryPage = paginated(WebhookDeliveryOutput, "PaginatedWebhookDeliveryList")


def _detail(request: Request, webhook_id: UUID) -> Response:
    with _refusals():
        endpoint = selectors.endpoint_get(
            organization=organization_of(request), endpoint_id=webhook_id
        )
    return Response(WebhookEndpointOutput(endpoint_row(endpoint)).data)


def _delivery_response(delivery: WebhookDelivery, status: int) -> Response:
    fresh = selectors.delivery_list(endpoint=delivery.endpoint).get(pk=delivery.pk)
    return Response(WebhookDeliveryOutput(delivery_row(fresh)).data, status=status)


# --------------------------------------------------------------------------- /webhooks
class WebhooksApi(ApiView):
    queries: ClassVar[dict[str, type[serializers.Serializer[Any]]]] = {"get": PageQuery}

    @extend_schema(
        tags=[TAG_WEBHOOKS],
        operation_id="webhooks_list",
        summary="List webhook endpoints",
        parameters=[PageQuery],
        responses={200: EndpointPage, **error_responses(*LIST_ERRORS)},
    )
    def get(self, request: Request) -> Response:
        """Your organization's endpoints, newest first (their secrets never shown)."""
        rows = selectors.endpoint_list(organization=organization_of(request))
        return page_response(
            request,
            rows,
            self.query,
            lambda page, many: WebhookEndpointOutput([endpoint_row(e) for e in page], many=many),
        )

    @extend_schema(
        tags=[TAG_WEBHOOKS],
        operation_id="webhooks_create",
        summary="Register a webhook endpoint",
        request=WebhookEndpointCreateInput,
        parameters=POST_PARAMETERS,
        examples=[
            OpenApiExample(
                "Runs that end",
                value={
                    "url": "https://hooks.example.com/orchestrator",
                    "events": ["run.completed", "run.failed", "run.cancelled"],
                },
            )
        ],
        responses={201: WebhookEndpointCreatedOutput, **error_responses(*WRITE_ERRORS)},
    )
    @idempotent_sealing("secret")  # the stored answer holds the secret encrypted
    def post(self, request: Request) -> Response:
        """Register an endpoint for the event types given. The answer holds its signing
        secret (generated when none is given): shown this once. On any problem nothing is
        stored (400 `invalid_request` naming the field; 409 `quota_exceeded` when your
        organization has as many endpoints as its quota)."""
        data = validated(WebhookEndpointCreateInput, request.data)
        client = client_of(request)
        with _refusals():
            endpoint, secret = services.endpoint_create(
                organization=client.organization, actor=client.actor, **data
            )
        output = WebhookEndpointCreatedOutput({**endpoint_row(endpoint), "secret": secret}).data
        response = Response(output, status=201)
        response["Location"] = reverse("api:webhook", kwargs={"webhook_id": endpoint.pk})
        return response


class WebhookApi(ApiView):
    @extend_schema(
        tags=[TAG_WEBHOOKS],
        operation_id="webhooks_retrieve",
        summary="Get a webhook endpoint",
        responses={200: WebhookEndpointOutput, **error_responses(404, *READ_ERRORS)},
    )
    def get(self, request: Request, webhook_id: UUID) -> Response:
        """One endpoint: its URL, events, whether it is enabled (and if not, why)."""
        return _detail(request, webhook_id)

    @extend_schema(
        tags=[TAG_WEBHOOKS],
        operation_id="webhooks_update",
        summary="Change a webhook endpoint",
        request=WebhookEndpointUpdateInput,
        responses={200: WebhookEndpointOutput, **error_responses(*WRITE_ERRORS, 404)},
    )
    def patch(self, request: Request, webhook_id: UUID) -> Response:
        """Change the fields given (a new `secret` replaces the old at once); `enabled`
        disables it, or enables it again after it was disabled."""
        data = validated(WebhookEndpointUpdateInput, request.data)
        with _refusals():
            services.endpoint_update(
                endpoint_id=webhook_id, organization=organization_of(request), **data
            )
        return _detail(request, webhook_id)

    @extend_schema(
        tags=[TAG_WEBHOOKS],
        operation_id="webhooks_delete",
        summary="Delete a webhook endpoint",
        responses={204: None, **error_responses(404, *READ_ERRORS)},
    )
    def delete(self, request: Request, webhook_id: UUID) -> Response:
        """Delete the endpoint with its deliveries, pending ones included. Again: 404."""
        with _refusals():
            services.endpoint_delete(endpoint_id=webhook_id, organization=organization_of(request))
        return Response(status=204)


class WebhookTestApi(ApiView):
    @extend_schema(
        tags=[TAG_WEBHOOKS],
        operation_id="webhooks_test",
        summary="Send a test delivery",
        request=EmptyInput,
        parameters=QUEUE_PARAMETERS,
        responses={
            202: OpenApiResponse(WebhookDeliveryOutput, description="Queued; sent at once."),
            **error_responses(*WRITE_ERRORS, 404),
        },
    )
    @idempotent
    def post(self, request: Request, webhook_id: UUID) -> Response:
        """Queue a `webhook.test` delivery to the endpoint (even a disabled one, to check
        it before enabling it again), signed like any; follow it in its deliveries. 429
        `too_many_pending_deliveries` (with `Retry-After`) while the endpoint has
        WEBHOOK_MAX_PENDING (100) deliveries pending: nothing is queued."""
        validated(EmptyInput, request.data)
        with _refusals():
            delivery = services.endpoint_test(
                endpoint_id=webhook_id, organization=organization_of(request)
            )
        services.kick()
        return _delivery_response(delivery, 202)


class WebhookDeliveriesApi(ApiView):
    queries: ClassVar[dict[str, type[serializers.Serializer[Any]]]] = {"get": PageQuery}

    @extend_schema(
        tags=[TAG_WEBHOOKS],
        operation_id="webhooks_deliveries",
        summary="List an endpoint's deliveries",
        parameters=[PageQuery],
        responses={200: DeliveryPage, **error_responses(*LIST_ERRORS)},
    )
    def get(self, request: Request, webhook_id: UUID) -> Response:
        """The endpoint's deliveries, newest first, each with every attempt's status code,
        error and latency."""
        with _refusals():
            endpoint = selectors.endpoint_get(
                organization=organization_of(request), endpoint_id=webhook_id
            )
        rows = selectors.delivery_list(endpoint=endpoint)
        return page_response(
            request,
            rows,
            self.query,
            lambda page, many: WebhookDeliveryOutput([delivery_row(d) for d in page], many=many),
        )


class WebhookRedeliverApi(ApiView):
    @extend_schema(
        tags=[TAG_WEBHOOKS],
        operation_id="webhooks_redeliver",
        summary="Send a delivery again",
        request=EmptyInput,
        parameters=QUEUE_PARAMETERS,
        responses={
            202: OpenApiResponse(WebhookDeliveryOutput, description="Due again; sent at once."),
            **error_responses(*WRITE_ERRORS, 404),
        },
    )
    @idempotent
    def post(self, request: Request, webhook_id: UUID, delivery_id: UUID) -> Response:
        """Send the delivery again, with the same `id` and body (a receiver that
        de-duplicates ignores it), retried for a new window; failed or delivered alike.
        429 `too_many_pending_deliveries` as a test, unless the delivery is still
        pending (it adds nothing)."""
        validated(EmptyInput, request.data)
        with _refusals():
            delivery = services.delivery_redeliver(
                delivery_uid=delivery_id,
                endpoint_id=webhook_id,
                organization=organization_of(request),
            )
        services.kick()
        return _delivery_response(delivery, 202)
