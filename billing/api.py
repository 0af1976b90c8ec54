"""The billing API: the caller's organization's balance and ledger (read-only)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from billing.models import EntryType
from billing.selectors import ledger_for, organization_balance
from runs.api.authentication import organization_of
from runs.api.errors import LIST_ERRORS, READ_ERRORS, RETRY_AFTER_PARAMETER, error_responses
from runs.api.pagination import PageQuery, paginated
from runs.api.serializers import BalanceOutput, LedgerEntryOutput
from runs.api.views import ApiView, page_response

TAG_BILLING = "billing"
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
    class LedgerQuery(PageQuery):
        type = serializers.ChoiceField(choices=EntryType.choices, required=False)
        run = serializers.UUIDField(required=False, help_text="Only this run's entries.")

    queries = {"get": LedgerQuery}

    @extend_schema(
        tags=[TAG_BILLING],
        operation_id="billing_ledger",
        summary="Your ledger",
        parameters=[LedgerQuery, RETRY_AFTER_PARAMETER],
        responses={200: LedgerPage, **error_responses(*LIST_ERRORS)},
    )
    def get(self, request: Request) -> Response:
        """Every movement of your credits, newest first: grants, reservations, charges and
        refunds. Append-only."""
        params = self.query
        entries = ledger_for(organization_of(request))
        if "type" in params:
            entries = entries.filter(type=params["type"])
        if "run" in params:
            entries = entries.filter(run_id=params["run"])
        return page_response(request, entries, params, LedgerEntryOutput)
