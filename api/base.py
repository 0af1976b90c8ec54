"""The base of every API view (``ApiView``: tracing, log context, bounded bodies, query
parameters checked before anything is looked up) and what the endpoints' modules share:
``validated`` input, ``written`` rows, ``page_response``, the schema of a list
(``list_schema``) and the headers every POST documents (``POST_PARAMETERS``).

Every query goes through the caller's organization (``organization_of``): another
organization's object is "not found" (404) for every method and action, never 403.
Every POST is idempotent under an `Idempotency-Key` (``@idempotent``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

from django.http import QueryDict
from drf_spectacular.utils import extend_schema
from opentelemetry.trace import SpanKind
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from api.authentication import ApiClient
from api.errors import LIST_ERRORS, RETRY_AFTER_PARAMETER, error_responses
from api.idempotency import IDEMPOTENCY_PARAMETER, REPLAYED_PARAMETER
from api.pagination import paginate
from api.parsers import refuse_if_too_large
from api.query_parameters import NoQuery, checked_query, filter_parameters
from api.serializers import FastOutput
from common import logcontext, tracing
from common.filters import StrictFilterSet

POST_PARAMETERS = [IDEMPOTENCY_PARAMETER, REPLAYED_PARAMETER, RETRY_AFTER_PARAMETER]


def validated(serializer_class: type[serializers.Serializer[Any]], data: Any) -> dict[str, Any]:
    serializer = serializer_class(data=data)
    serializer.is_valid(raise_exception=True)
    return dict(serializer.validated_data)


def written(output: Any, rows: list[Any]) -> Any:
    """A page's rows as ``output`` (a serializer class, or a callable making one with its
    context) writes them: a FastOutput the short way."""
    if isinstance(output, type) and issubclass(output, FastOutput):
        return output.rows(rows)
    return output(rows, many=True).data


def page_response(request: Request, rows: Any, params: dict[str, Any], output: Any) -> Response:
    envelope, page = paginate(
        request, rows, page=params.get("page"), page_size=params.get("page_size")
    )
    return Response({**envelope, "results": written(output, page)})


# A route's parameter in Django's syntax (`<uuid:run_id>`, `<token>`).
_PARAMETER = re.compile(r"<(?:\w+:)?(\w+)>")


def route_template(request: Any) -> str:
    """The route the request matched, as a template: `/api/v1/callbacks/{token}`, what
    a trace may carry (the path may hold a credential); "/" when none matched."""
    route = getattr(getattr(request, "resolver_match", None), "route", "") or ""
    return "/" + _PARAMETER.sub(r"{\1}", route)


class ApiView(APIView):
    """Authentication, throttling, parsing and errors come from REST_FRAMEWORK settings.

    ``queries`` names the query parameters each method accepts besides filters (none by
    default; a list's pagination), and ``filterset`` the filters of a GET list, which its
    selector applies. Both are checked after authentication and throttling and before
    anything is looked up (``api.query_parameters.checked_query``): the former validated into
    ``self.query``, the latter kept as sent in ``self.filters``, for the selector, and
    as the FilterSet cleans them in ``self.filter_values``, for a selector that applies
    them in a statement of its own.
    """

    queries: ClassVar[dict[str, type[serializers.Serializer[Any]]]] = {}
    filterset: ClassVar[type[StrictFilterSet] | None] = None
    large_body: ClassVar[bool] = False
    query: dict[str, Any]
    filters: QueryDict
    filter_values: dict[str, Any]

    def dispatch(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        # The request's log lines name the run it is about, and (once its key is known)
        # the organization (common.logcontext).
        with logcontext.bound(run_id=kwargs.get("run_id")):
            if not tracing.enabled:
                return super().dispatch(request, *args, **kwargs)
            # The request's span: a trace's root, or a child of the client's
            # `traceparent`; a run it creates keeps it (docs/observability.md). It
            # names the route's template, never the path: a callback's token is in it.
            route = route_template(request)
            with tracing.span(
                f"{request.method} {route}",
                parent_context=tracing.from_headers(request.META),
                kind=SpanKind.SERVER,
                attributes={"http.request.method": request.method or "", "http.route": route},
            ) as span:
                response = super().dispatch(request, *args, **kwargs)
                span.set_attribute("http.response.status_code", response.status_code)
                if response.status_code >= 500:
                    tracing.failed(span, str(response.status_code))
                return response

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        super().initial(request, *args, **kwargs)
        client = getattr(request, "user", None)
        if isinstance(client, ApiClient):
            logcontext.add(organization_id=client.api_key.organization_id)
        method = (request.method or "").lower()
        # Other methods' bodies are never read; a view taking files sets its own limit.
        if method in ("post", "put", "patch") and not self.large_body:
            refuse_if_too_large(request.META.get("CONTENT_LENGTH"))
        filterset = self.filterset if method == "get" else None
        self.query, self.filters, self.filter_values = checked_query(
            request, self.queries.get(method, NoQuery), filterset
        )


Handler = TypeVar("Handler", bound=Callable[..., Response])


def list_schema(
    summary: str,
    query: Any,
    filterset: type[StrictFilterSet],
    page: Any,
    operation_id: str,
    *,
    tag: str,
) -> Callable[[Handler], Handler]:
    """The schema of a GET list: its query, its filters' parameters, its page."""
    return extend_schema(
        tags=[tag],
        summary=summary,
        operation_id=operation_id,
        parameters=[query, *filter_parameters(filterset), RETRY_AFTER_PARAMETER],
        responses={200: page, **error_responses(*LIST_ERRORS)},
    )
