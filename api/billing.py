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
from api.errors import LIST_ERRORS, READ_ERRORS, RETRY_AFTER_PARAMETER, error_responses
from api.pagination import PageQuery, paginated
from api.parsers import AnyStringJSONParser
from api.query import filter_parameters
from api.serializers import (
    BalanceOutput,
    InputSerializer,
    LedgerEntryOutput,
    StrictCharField,
)
from api.views import ApiView, page_response, validated
from billing.filters import LedgerFilter
from billing.models import SECRET_NAME_PATTERN
from billing.secrets import is_valid_secret_name, secret_delete, secret_list, secret_put
from billing.selectors import ledger_for, organization_balance

TAG_BILLING = "billing"
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
