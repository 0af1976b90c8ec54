"""The rate limits API: an organization declares the limits its steps spend units of
(docs/rate-limits.md). Writes need a `full` key; reads a `read` one too."""

from __future__ import annotations

import re
from typing import Any

from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.exceptions import NotFound
from rest_framework.request import Request
from rest_framework.response import Response

from api.authentication import organization_of
from api.base import ApiView, page_response, validated
from api.errors import LIST_ERRORS, READ_ERRORS, RETRY_AFTER_PARAMETER, error_responses
from api.pagination import PageQuery, paginated
from api.serializers import InputSerializer, StrictCharField, StrictIntegerField
from ratelimits.models import MAX_LIMIT, MAX_PERIOD_MS
from ratelimits.selectors import rate_limit_get, rate_limit_list
from runs.admission.step_admission import rate_limit_delete, rate_limit_put
from runs.plan.durations import DurationRefused, format_duration_ms, read_duration_ms
from runs.plan.fields import RATE_LIMIT_NAME_MAX_LENGTH, RATE_LIMIT_NAME_PATTERN

TAG_RATE_LIMITS = "rate-limits"
NAME_RULE = (
    "a letter or digit, then letters, digits, '_', '.', ':' or '-'; "
    f"at most {RATE_LIMIT_NAME_MAX_LENGTH} characters"
)


class RateLimitOutput(serializers.Serializer[Any]):
    name = serializers.CharField()
    limit = serializers.IntegerField(help_text="Units granted at most in any window.")
    period = serializers.SerializerMethodField(help_text="The window, as a duration.")
    period_ms = serializers.IntegerField()
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()

    def get_period(self, limit: Any) -> str:
        return format_duration_ms(limit.period_ms)


RateLimitPage = paginated(RateLimitOutput, "PaginatedRateLimitList")

NAME_PARAMETER = OpenApiParameter(
    name="name",
    type=str,
    location=OpenApiParameter.PATH,
    pattern=RATE_LIMIT_NAME_PATTERN,
    description=f"The limit's name, as steps write it in `rate_limits`: {NAME_RULE}.",
)


def _named(name: str) -> str:
    if not re.fullmatch(RATE_LIMIT_NAME_PATTERN, name) or len(name) > RATE_LIMIT_NAME_MAX_LENGTH:
        raise serializers.ValidationError({"name": [NAME_RULE]})
    return name


class RateLimitsApi(ApiView):
    queries = {"get": PageQuery}

    @extend_schema(
        tags=[TAG_RATE_LIMITS],
        operation_id="rate_limits_list",
        summary="List your rate limits",
        parameters=[PageQuery, RETRY_AFTER_PARAMETER],
        responses={200: RateLimitPage, **error_responses(*LIST_ERRORS)},
    )
    def get(self, request: Request) -> Response:
        """Your organization's rate limits, by name."""
        limits = rate_limit_list(organization_of(request))
        return page_response(request, limits, self.query, RateLimitOutput)


class RateLimitApi(ApiView):
    class RateLimitInput(InputSerializer):
        limit = StrictIntegerField(
            min_value=1, max_value=MAX_LIMIT, help_text="Units granted at most in any window."
        )
        period = StrictCharField(
            max_length=32,
            help_text="The window's length in the plan's duration syntax (`500ms`, `5s`, "
            "`1m`, `1h`, `1d`), from 1 ms to a day.",
        )

        def validate_period(self, value: str) -> int:
            try:
                return read_duration_ms(value, minimum_ms=1, maximum_ms=MAX_PERIOD_MS)
            except DurationRefused as exc:
                raise serializers.ValidationError(str(exc)) from None

    @extend_schema(
        tags=[TAG_RATE_LIMITS],
        operation_id="rate_limits_get",
        summary="Show a rate limit",
        parameters=[NAME_PARAMETER, RETRY_AFTER_PARAMETER],
        responses={200: RateLimitOutput, **error_responses(404, *READ_ERRORS)},
    )
    def get(self, request: Request, name: str) -> Response:
        """The limit `name` of your organization; 404 when it has none of that name."""
        found = rate_limit_get(organization_of(request), name)
        if found is None:
            raise NotFound("not found")
        return Response(RateLimitOutput(found).data)

    @extend_schema(
        tags=[TAG_RATE_LIMITS],
        operation_id="rate_limits_put",
        summary="Declare or change a rate limit",
        request=RateLimitInput,
        parameters=[NAME_PARAMETER, RETRY_AFTER_PARAMETER],
        responses={
            201: OpenApiResponse(RateLimitOutput, description="Declared."),
            200: OpenApiResponse(RateLimitOutput, description="Changed (or unchanged)."),
            **error_responses(*READ_ERRORS, 404, 409, 413, 415),
        },
    )
    def put(self, request: Request, name: str) -> Response:
        """At most `limit` units in any window of `period`, shared by every step of your
        organization that names it (201 when new, 200 when changed). Steps waiting for
        it are re-planned under the new limit at once. A new one past your organization's
        quota is refused (409 `quota_exceeded`); a change never is."""
        _named(name)
        data = validated(self.RateLimitInput, request.data)
        found, created = rate_limit_put(
            organization=organization_of(request),
            name=name,
            limit=data["limit"],
            period_ms=data["period"],
        )
        return Response(RateLimitOutput(found).data, status=201 if created else 200)

    @extend_schema(
        tags=[TAG_RATE_LIMITS],
        operation_id="rate_limits_delete",
        summary="Delete a rate limit",
        parameters=[NAME_PARAMETER, RETRY_AFTER_PARAMETER],
        responses={204: None, **error_responses(404, *READ_ERRORS)},
    )
    def delete(self, request: Request, name: str) -> Response:
        """Remove the limit: it limits nothing any more and the steps waiting for it go on
        at once. New runs that name it are refused (`invalid_plan`)."""
        if not rate_limit_delete(organization=organization_of(request), name=name):
            raise NotFound("not found")
        return Response(status=204)
