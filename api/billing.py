"""The billing API: the caller's organization's balance and ledger (read-only), and its
secrets (written here, never read back: only their names and dates are listed)."""

from __future__ import annotations

from typing import Any

from django.core.validators import ProhibitNullCharactersValidator
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.exceptions import NotFound
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.validators import ProhibitSurrogateCharactersValidator

from api.authentication import organization_of
from api.base import ApiView, page_response, validated
from api.errors import LIST_ERRORS, READ_ERRORS, RETRY_AFTER_PARAMETER, error_responses
from api.pagination import PageQuery, paginated
from api.parsers import AnyStringJSONParser
from api.query_parameters import filter_parameters
from api.runners import polls_held
from api.serializers import (
    BalanceOutput,
    InputSerializer,
    LedgerEntryOutput,
    StrictCharField,
)
from artifacts.selectors import artifacts_held
from billing import quotas
from billing.filters import LedgerFilter
from billing.models import SECRET_NAME_PATTERN, Organization
from billing.secrets import is_valid_secret_name, secret_delete, secret_list, secret_put
from billing.selectors import ledger_for, organization_balance
from common import eventstreams
from ratelimits.selectors import rate_limit_list
from runs.admission.fairness import organization_load
from runs.admission.step_admission import timers_held
from schedules.services import schedules_held
from webhooks.services import deliveries_in_flight, endpoints_held

TAG_BILLING = "billing"
TAG_ORGANIZATION = "organization"
TAG_SECRETS = "secrets"
LedgerPage = paginated(LedgerEntryOutput, "PaginatedLedgerEntryList")


class BalanceApi(ApiView):
    @extend_schema(
        tags=[TAG_BILLING],
        operation_id="billing_balance",
        parameters=[RETRY_AFTER_PARAMETER],
        summary="Your credit balance",
        responses={200: BalanceOutput, **error_responses(*READ_ERRORS)},
    )
    def get(self, request: Request) -> Response:
        """Available (for new reservations), reserved (held by runs in progress), spent."""
        balance = organization_balance(organization_of(request))
        data: dict[str, Any] = {
            "available": balance.available,
            "reserved": balance.reserved,
            "spent": balance.spent,
            "total": balance.total,
        }
        return Response(BalanceOutput(data).data)


class LimitsOutput(serializers.Serializer[Any]):
    max_running_runs = serializers.IntegerField(
        help_text="Runs running at once; more wait as PENDING with a `queued_reason`."
    )
    max_running_steps = serializers.IntegerField(help_text="Steps executing at once.")
    max_pending_runs = serializers.IntegerField(
        help_text="Runs waiting to start; one more is refused with 429 `too_many_pending_runs`."
    )
    share = serializers.IntegerField(
        help_text="Weight when organizations share the workers (2: twice the share of 1)."
    )


class UsageOutput(serializers.Serializer[Any]):
    runs_running = serializers.IntegerField(
        help_text="Runs holding a place: started (running, paused, waiting...) and not ended."
    )
    runs_queued = serializers.IntegerField(
        help_text="Runs waiting for a place (their `queued_reason` says why)."
    )
    runs_pending = serializers.IntegerField(
        help_text="PENDING runs, queued or about to be picked up (what `max_pending_runs` caps)."
    )
    steps_executing = serializers.IntegerField(help_text="Steps executing on workers now.")


class QuotaOutput(serializers.Serializer[Any]):
    limit = serializers.IntegerField(help_text="The quota in force: its own, or the default.")
    used = serializers.IntegerField(help_text="How many the organization holds now.")


class QuotasOutput(serializers.Serializer[Any]):
    webhook_endpoints = QuotaOutput(
        help_text="Webhook endpoints; one more is refused with 409 `quota_exceeded`."
    )
    schedules = QuotaOutput(help_text="Schedules; one more is refused with 409 `quota_exceeded`.")
    rate_limits = QuotaOutput(
        help_text="Rate limits; a new one is refused with 409 `quota_exceeded`."
    )
    event_streams = QuotaOutput(
        help_text="Event streams open at once; one more is refused with 429 `too_many_streams`."
    )
    runner_polls = QuotaOutput(
        help_text="Runner polls held at once; one more hold is refused with 429 `too_many_polls`."
    )
    webhooks_in_flight = QuotaOutput(
        help_text="Webhook deliveries being sent at once; the others wait, pending, for one to end."
    )
    artifacts = QuotaOutput(
        help_text="Artifacts stored (uploading or available, not expired); one more upload "
        "is refused with 409 `quota_exceeded`."
    )
    artifact_bytes = QuotaOutput(
        help_text="Bytes of those artifacts; an upload that would exceed it is refused with "
        "409 `quota_exceeded`."
    )
    parked_waits = QuotaOutput(
        help_text="`wait` steps parked on their timers at once; one more fails its attempt "
        "with `quota_exceeded`."
    )


class OrganizationOutput(serializers.Serializer[Any]):
    id = serializers.UUIDField()
    name = serializers.CharField()
    limits = LimitsOutput(help_text="In force now: the organization's own, or the defaults.")
    usage = UsageOutput()
    quotas = QuotasOutput(help_text="How many of each it may hold (its own, or the defaults).")


def quota_use(organization: Organization) -> dict[str, dict[str, int]]:
    """Each quota in force with what the organization holds against it, counted as the
    services that check it count."""
    artifacts = artifacts_held(organization=organization)
    used = {
        quotas.WEBHOOK_ENDPOINTS: endpoints_held(organization=organization).count(),
        quotas.SCHEDULES: schedules_held(organization=organization).count(),
        quotas.RATE_LIMITS: rate_limit_list(organization).count(),
        quotas.EVENT_STREAMS: eventstreams.streams_open(organization.pk),
        quotas.RUNNER_POLLS: polls_held(organization.pk),
        quotas.WEBHOOKS_IN_FLIGHT: deliveries_in_flight(organization=organization).count(),
        quotas.ARTIFACTS: quotas.quota_used(quotas.ARTIFACTS, artifacts),
        quotas.ARTIFACT_BYTES: quotas.quota_used(quotas.ARTIFACT_BYTES, artifacts),
        quotas.PARKED_WAITS: timers_held(organization.pk).count(),
    }
    return {
        name: {"limit": limit, "used": used[name]}
        for name, limit in quotas.quotas_of(organization).items()
    }


class OrganizationApi(ApiView):
    @extend_schema(
        tags=[TAG_ORGANIZATION],
        operation_id="organization_get",
        parameters=[RETRY_AFTER_PARAMETER],
        summary="Your organization: its limits and quotas, and their use",
        responses={200: OrganizationOutput, **error_responses(*READ_ERRORS)},
    )
    def get(self, request: Request) -> Response:
        """The limits that apply to your runs (docs/fairness.md), your quotas
        (docs/tenants.md), and how much of them is in use now. Operators change them in
        the admin; a change applies at once."""
        organization = organization_of(request)
        load = organization_load(organization.pk)
        data = {
            "id": organization.pk,
            "name": organization.name,
            "limits": {
                "max_running_runs": load.limits.max_running_runs,
                "max_running_steps": load.limits.max_running_steps,
                "max_pending_runs": load.limits.max_pending_runs,
                "share": load.limits.share,
            },
            "usage": {
                "runs_running": load.runs_running,
                "runs_queued": load.runs_queued,
                "runs_pending": load.runs_pending,
                "steps_executing": load.steps_executing,
            },
            "quotas": quota_use(organization),
        }
        return Response(OrganizationOutput(data).data)


class LedgerApi(ApiView):
    queries = {"get": PageQuery}
    filterset = LedgerFilter

    @extend_schema(
        tags=[TAG_BILLING],
        operation_id="billing_ledger",
        summary="Your ledger",
        parameters=[PageQuery, *filter_parameters(LedgerFilter), RETRY_AFTER_PARAMETER],
        responses={200: LedgerPage, **error_responses(*LIST_ERRORS)},
    )
    def get(self, request: Request) -> Response:
        """Every movement of your credits, newest first: grants, reservations, charges and
        refunds. Append-only."""
        entries = ledger_for(organization_of(request), query=self.filters)
        return page_response(request, entries, self.query, LedgerEntryOutput)


# --------------------------------------------------------------------------- secrets
class SecretOutput(serializers.Serializer[Any]):
    """A secret as the API shows it: never its value."""

    name = serializers.CharField()
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField(help_text="When the value was last replaced.")


SecretPage = paginated(SecretOutput, "PaginatedSecretList")

SECRET_NAME_PARAMETER = OpenApiParameter(
    name="name",
    type=str,
    location=OpenApiParameter.PATH,
    pattern=f"^{SECRET_NAME_PATTERN}$",
    description="A letter or _, then letters, digits or _; at most 100 characters. "
    "Plans read the value as `${secrets.NAME}`.",
)


class SecretValueField(StrictCharField):
    """Any JSON string, exactly as sent: empty, NUL characters and unpaired surrogates
    included (the value is stored encrypted, never as text)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(allow_blank=True, trim_whitespace=False, **kwargs)
        self.validators = [
            validator
            for validator in self.validators
            if not isinstance(
                validator, ProhibitNullCharactersValidator | ProhibitSurrogateCharactersValidator
            )
        ]


class SecretsApi(ApiView):
    queries = {"get": PageQuery}

    @extend_schema(
        tags=[TAG_SECRETS],
        operation_id="secrets_list",
        summary="List your secrets",
        parameters=[PageQuery, RETRY_AFTER_PARAMETER],
        responses={200: SecretPage, **error_responses(*LIST_ERRORS)},
    )
    def get(self, request: Request) -> Response:
        """Your organization's secrets by name: names and dates, never values."""
        secrets = secret_list(organization=organization_of(request))
        return page_response(request, secrets, self.query, SecretOutput)


class SecretApi(ApiView):
    # A value may be any string; the body's other strings are still checked.
    parser_classes = [AnyStringJSONParser]

    class SecretInput(InputSerializer):
        value = SecretValueField(help_text="Any string; stored encrypted, never returned.")

    @extend_schema(
        tags=[TAG_SECRETS],
        operation_id="secrets_put",
        summary="Create or replace a secret",
        request=SecretInput,
        parameters=[SECRET_NAME_PARAMETER, RETRY_AFTER_PARAMETER],
        responses={
            201: OpenApiResponse(SecretOutput, description="Created."),
            200: OpenApiResponse(SecretOutput, description="Its value replaced."),
            **error_responses(*READ_ERRORS, 404, 413, 415),
        },
    )
    def put(self, request: Request, name: str) -> Response:
        """Set the secret `name` of your organization to `value` (201 when new, 200 when
        replaced). The answer never holds the value; runs read it as `${secrets.NAME}`
        when a step's tool runs, and it is redacted from what the step leaves behind."""
        if not is_valid_secret_name(name):
            raise serializers.ValidationError(
                {"name": ["a letter or _, then letters, digits or _; at most 100 characters"]}
            )
        data = validated(self.SecretInput, request.data)
        secret, created = secret_put(
            organization=organization_of(request), name=name, value=data["value"]
        )
        return Response(SecretOutput(secret).data, status=201 if created else 200)

    @extend_schema(
        tags=[TAG_SECRETS],
        operation_id="secrets_delete",
        summary="Delete a secret",
        parameters=[SECRET_NAME_PARAMETER, RETRY_AFTER_PARAMETER],
        responses={204: None, **error_responses(404, *READ_ERRORS)},
    )
    def delete(self, request: Request, name: str) -> Response:
        """Delete the secret; 404 when your organization has none of that name. Steps
        that still refer to it fail with `template_error` when they run."""
        if not secret_delete(organization=organization_of(request), name=name):
            raise NotFound("not found")
        return Response(status=204)
