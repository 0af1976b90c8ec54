"""Every API error as JSON ``{"code", "message", "details"}`` with a stable ``code``.

``api_exception_handler`` (REST_FRAMEWORK["EXCEPTION_HANDLER"]) turns DRF's own
exceptions, Django's ``Http404`` and the domain exceptions of the services into that
shape (a route without the method asked: ``405 method_not_allowed``); ``unknown_route``,
the last route under ``/api/``, answers what no route matches with ``404 not_found``,
whatever DEBUG says; ``not_found`` and ``server_error`` do the same for what Django
answers itself (crashes outside a view) under ``/api/``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import InterfaceError, OperationalError
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponsePermanentRedirect,
)
from django.urls import Resolver404, resolve
from django.views import defaults
from django.views.decorators.csrf import csrf_exempt
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse
from rest_framework import exceptions, serializers
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView, set_rollback

from artifacts.selectors import ArtifactNotFound
from artifacts.services import (
    ArtifactExists,
    ArtifactNotReady,
    ArtifactTooLarge,
    InvalidName,
    RunStorageFull,
    TooManyUploads,
    UploadMismatch,
)
from artifacts.storage import StorageUnavailable
from billing.quotas import QuotaExceeded, TooManyPolls, TooManyStreams
from billing.services import InsufficientCredits
from common.filters import Problems, QueryInvalid
from runs.admission.run_admission import TooManyPendingRuns
from runs.catalogue import (
    InvalidToolDefinition,
    ToolNameTaken,
    ToolNotFound,
    ToolVersionConflict,
)
from runs.forks import InvalidFork
from runs.people.escalations import EscalationNotFound, EscalationResolved, ReplanLimitReached
from runs.plan import PlanInvalid, errors_as_dicts
from runs.services import AttemptsExhausted, RunDeleted, RunNotFound, StepNotFound
from runs.states import InvalidTransition
from runs.waits.callbacks import CallbackNotFound
from runs.waits.runners import DuplicateRunner, NotJobOwner, RunnerJobNotFound, RunnerNotFound
from schedules.services import ScheduleInvalid, ScheduleNotFound
from webhooks.services import TooManyPendingDeliveries

logger = logging.getLogger(__name__)

API_PREFIX = "/api/"

# DRF's codes, except where a more telling name exists; the rest are DRF's default_code.
DRF_CODES: dict[type[exceptions.APIException], str] = {
    exceptions.ValidationError: "invalid_request",
    exceptions.ParseError: "invalid_json",
}


class ErrorOutput(serializers.Serializer[Any]):
    """The body of every error response."""

    code = serializers.CharField(help_text="Stable, machine-readable error code.")
    message = serializers.CharField(help_text="What went wrong, for people.")
    details = serializers.JSONField(
        allow_null=True,
        help_text=(
            "Structured detail or null: for `invalid_request` and `invalid_plan` a list of "
            "`{path, message}`; for `invalid_transition` `{entity, from, to}`; for "
            "`insufficient_credits` `{needed, available}`; for `throttled` `{retry_after}`; "
            "for `insufficient_scope` `{scope, required}`; for `quota_exceeded` "
            "`{quota, limit}`."
        ),
    )


def error_body(code: str, message: str, details: Any = None) -> dict[str, Any]:
    return {"code": code, "message": message, "details": details}


def error_response(status: int, code: str, message: str) -> HttpResponse:
    """An error answered outside DRF (a path no route matches, Django's 404 and 500),
    rendered by DRF's renderer as every other error body: the same bytes, not
    JsonResponse's spacing."""
    content = JSONRenderer().render(error_body(code, message))
    return HttpResponse(content, status=status, content_type=JSONRenderer.media_type)


# --------------------------------------------------------------------------- domain errors
def _transition_details(exc: InvalidTransition) -> dict[str, str]:
    return {"entity": exc.entity, "from": exc.from_state, "to": exc.to_state}


def _credit_details(exc: InsufficientCredits) -> dict[str, str]:
    return {"needed": str(exc.needed), "available": str(exc.available)}


def _schedule_problems(exc: ScheduleInvalid) -> list[dict[str, str]]:
    return [{"path": p.path, "message": p.message, "code": p.code} for p in exc.problems]


def _schedule_message(exc: ScheduleInvalid) -> str:
    first = exc.problems[0] if exc.problems else None
    return f"invalid request: {first.path}: {first.message}" if first else "invalid request"


def _plan_message(exc: PlanInvalid) -> str:
    count = len(exc.errors)
    first = str(exc.errors[0]) if exc.errors else ""
    more = f" (and {count - 1} more problems)" if count > 1 else ""
    return f"the plan is invalid: {first}{more}"


# exception type -> (status, details, message); the code is the exception's own `code`.
DOMAIN_ERRORS: dict[type[Exception], tuple[int, Callable[[Any], Any], Callable[[Any], str]]] = {
    PlanInvalid: (400, lambda exc: errors_as_dicts(exc.errors), _plan_message),
    InvalidFork: (400, lambda exc: {"paths": exc.paths}, str),
    InvalidTransition: (409, _transition_details, str),
    InsufficientCredits: (402, _credit_details, str),
    AttemptsExhausted: (409, lambda exc: None, str),
    RunDeleted: (409, lambda exc: None, str),
    RunNotFound: (404, lambda exc: None, lambda exc: "not found"),
    StepNotFound: (404, lambda exc: None, str),
    RunnerNotFound: (404, lambda exc: None, lambda exc: "not found"),
    RunnerJobNotFound: (404, lambda exc: None, lambda exc: "not found"),
    DuplicateRunner: (409, lambda exc: exc.details, str),
    NotJobOwner: (409, lambda exc: None, str),
    InvalidToolDefinition: (400, lambda exc: None, str),
    ToolNotFound: (404, lambda exc: None, lambda exc: "not found"),
    ToolVersionConflict: (409, lambda exc: exc.details, str),
    ToolNameTaken: (409, lambda exc: exc.details, str),
    CallbackNotFound: (404, lambda exc: None, lambda exc: "not found"),
    ArtifactNotFound: (404, lambda exc: None, lambda exc: "not found"),
    ArtifactExists: (409, lambda exc: None, str),
    ArtifactNotReady: (409, lambda exc: None, str),
    UploadMismatch: (409, lambda exc: None, str),
    TooManyUploads: (429, lambda exc: None, str),
    TooManyPendingRuns: (429, lambda exc: {"retry_after": exc.retry_after}, str),
    QuotaExceeded: (409, lambda exc: exc.details, str),
    TooManyStreams: (429, lambda exc: exc.details, str),
    TooManyPolls: (429, lambda exc: exc.details, str),
    RunStorageFull: (413, lambda exc: None, str),
    ArtifactTooLarge: (413, lambda exc: None, str),
    InvalidName: (400, lambda exc: None, str),
    StorageUnavailable: (503, lambda exc: None, lambda exc: "artifact storage is unavailable"),
    EscalationNotFound: (404, lambda exc: None, lambda exc: "not found"),
    EscalationResolved: (409, lambda exc: None, str),
    ReplanLimitReached: (409, lambda exc: None, str),
    ScheduleNotFound: (404, lambda exc: None, lambda exc: "not found"),
    ScheduleInvalid: (400, _schedule_problems, _schedule_message),
    TooManyPendingDeliveries: (
        429,
        lambda exc: {"retry_after": exc.retry_after, "limit": exc.limit},
        str,
    ),
}


# --------------------------------------------------------------------------- DRF errors
def _join(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    if key == "non_field_errors":
        return path
    return f"{path}.{key}" if path else key


def flatten_errors(detail: Any, path: str = "") -> list[dict[str, str]]:
    """DRF's nested error detail as a flat list of ``{path, message, code}``."""
    if isinstance(detail, dict):
        return [
            problem
            for key, value in detail.items()
            for problem in flatten_errors(value, _join(path, key))
        ]
    if isinstance(detail, list):
        if all(isinstance(item, str) for item in detail):
            return [problem for item in detail for problem in flatten_errors(item, path)]
        return [
            problem
            for index, item in enumerate(detail)
            for problem in flatten_errors(item, _join(path, index))
        ]
    code = getattr(detail, "code", None) or "invalid"
    return [{"path": path, "message": str(detail), "code": str(code)}]


def problems_detail(problems: Problems) -> dict[str, list[exceptions.ErrorDetail]]:
    """A FilterSet's problems (Django's ValidationErrors) as DRF's error detail."""
    return {
        name: [
            exceptions.ErrorDetail(message, code=error.code or "invalid")
            for error in errors
            for message in error.messages
        ]
        for name, errors in problems.items()
    }


def _api_error(exc: exceptions.APIException) -> Response:
    headers: dict[str, str] = {}
    if getattr(exc, "auth_header", None):
        headers["WWW-Authenticate"] = str(exc.auth_header)  # type: ignore[attr-defined]
    code = DRF_CODES.get(type(exc), str(exc.default_code))
    details: Any = None
    if isinstance(exc, exceptions.ValidationError):
        details = flatten_errors(exc.detail)
        first = details[0] if details else {"path": "", "message": "invalid"}
        where = f"{first['path']}: " if first["path"] else ""
        message = f"invalid request: {where}{first['message']}"
    else:
        message = str(exc.detail)
    if getattr(exc, "details", None) is not None:
        details = exc.details  # type: ignore[attr-defined]
    if getattr(exc, "retry_after", None):
        headers["Retry-After"] = str(exc.retry_after)  # type: ignore[attr-defined]
    wait = getattr(exc, "wait", None)
    if isinstance(exc, exceptions.Throttled) and wait is not None:
        retry_after = max(1, math.ceil(wait))
        headers["Retry-After"] = str(retry_after)
        details = {"retry_after": retry_after}
        message = f"too many requests for this API key; retry in {retry_after} s"
    return Response(error_body(code, message, details), status=exc.status_code, headers=headers)


def api_exception_handler(exc: Exception, context: dict[str, Any]) -> Response:
    set_rollback()
    if isinstance(exc, Http404):
        exc = exceptions.NotFound("not found")
    elif isinstance(exc, DjangoPermissionDenied):
        exc = exceptions.PermissionDenied()
    elif isinstance(exc, DjangoValidationError):
        exc = exceptions.ValidationError(exc.messages)
    elif isinstance(exc, QueryInvalid):  # a selector refused its query
        exc = exceptions.ValidationError(problems_detail(exc.problems))
    if isinstance(exc, exceptions.APIException):
        return _api_error(exc)
    for exc_type, (status, details, message) in DOMAIN_ERRORS.items():
        if isinstance(exc, exc_type):
            code = str(getattr(exc, "code", "error"))
            # A refusal that passes (too many uploads, storage down) says when to retry.
            retry_after = getattr(exc, "retry_after", None)
            headers = {"Retry-After": str(retry_after)} if retry_after else None
            return Response(
                error_body(code, message(exc), details(exc)), status=status, headers=headers
            )
    if isinstance(exc, OperationalError | InterfaceError):
        # PostgreSQL unreachable or restarting: nothing was written (the view's
        # transaction rolled back), and the same request will work once it is back.
        logger.warning("database unavailable in %s: %s", _view_name(context), exc)
        return Response(
            error_body("service_unavailable", "the database is unavailable; retry shortly"),
            status=503,
            headers={"Retry-After": "1"},
        )
    logger.exception("unhandled error in %s", _view_name(context))
    return Response(error_body("internal_error", "internal server error"), status=500)


def _view_name(context: dict[str, Any]) -> str:
    return context.get("view").__class__.__name__


# --------------------------------------------------------------------------- outside DRF
# The name of the catch-all route under /api/ (config/urls.py): metrics count what it
# answers as "unmatched", as they did when Django answered it.
UNKNOWN_ROUTE = "api-unknown-route"


@csrf_exempt  # a POST to an unknown route is a 404, not a CSRF failure page
def unknown_route(request: HttpRequest) -> HttpResponse:
    """What no route under /api/ matches: ``404 not_found``, whatever the method.

    A route, not handler404: with DEBUG on, Django answers a URL no route matches with its
    technical 404 page (listing every route) and never calls handler404. Being last, it
    also makes every path under /api/ "valid" to CommonMiddleware, which then no longer
    appends a slash by itself: a GET of a page that exists with one (``/api/docs``) is
    sent there here, as before; an API route never ends with one, so none is redirected.
    """
    if (
        request.method in ("GET", "HEAD")
        and settings.APPEND_SLASH
        and not request.path_info.endswith("/")
    ):
        try:
            match = resolve(f"{request.path_info}/", getattr(request, "urlconf", None))
        except Resolver404:
            match = None
        if match is not None and match.url_name != UNKNOWN_ROUTE:
            return HttpResponsePermanentRedirect(request.get_full_path(force_append_slash=True))
    return error_response(404, "not_found", "not found")


class JsonErrors(APIView):
    """Mixed into a DRF view under /api/ whose own answers are not JSON (the OpenAPI
    document, the docs pages): its errors (a 405, a 406) are, in the envelope, whatever
    renderer it negotiated; they would otherwise be YAML or an HTML page."""

    def finalize_response(
        self, request: Request, response: Response, *args: Any, **kwargs: Any
    ) -> Response:
        response = super().finalize_response(request, response, *args, **kwargs)
        # Only DRF's own Responses are rendered late enough to change their renderer.
        if isinstance(response, Response) and response.status_code >= 400:
            response.accepted_renderer = JSONRenderer()
            response.accepted_media_type = JSONRenderer.media_type
        return response


def not_found(request: HttpRequest, exception: Exception) -> HttpResponse:
    """handler404: JSON under /api/ (an Http404 raised outside DRF, with DEBUG off),
    Django's page elsewhere."""
    if request.path.startswith(API_PREFIX):
        return error_response(404, "not_found", "not found")
    return defaults.page_not_found(request, exception)


def server_error(request: HttpRequest) -> HttpResponse:
    if request.path.startswith(API_PREFIX):
        return error_response(500, "internal_error", "internal server error")
    return defaults.server_error(request)


# --------------------------------------------------------------------------- OpenAPI
ERROR_DESCRIPTIONS: dict[int, str] = {
    400: "`invalid_request` (every malformed or unknown field or query parameter, with its "
    "path, in `details`), `invalid_json`, `invalid_yaml` (a YAML body of `POST /runs` or "
    "`/schedules`), "
    "`invalid_plan` (every problem of the plan with its path in `details`), "
    "`invalid_fork` (a fork's `plan` is not an object, its `from` names no step, or a step "
    "it would reuse changed: "
    "`details.paths`), "
    "`invalid_idempotency_key`",
    401: "`not_authenticated` (no key) or `authentication_failed` (unknown, malformed or "
    "revoked key)",
    402: "`insufficient_credits`: the organization cannot cover the reservation",
    403: "`insufficient_scope`: this API key's scope does not cover the route "
    "(`details`: scope, required); checked before any object is looked up; "
    "`organization_suspended`: an operator suspended the key's organization, every request "
    "with its keys is refused until it is unsuspended",
    404: "`not_found`: no such object in your organization (or no such page)",
    409: "`invalid_transition` (`details`: entity, from, to), `attempts_exhausted`, "
    "`run_deleted`, `idempotency_key_in_use` (the first request with this key is still "
    "being processed), `quota_exceeded` (creating one more webhook endpoint, schedule "
    "or rate limit than the organization's quota; `details`: quota, limit), or, from a "
    "worker's registration, `tool_version_conflict` (a tool version published before with "
    "another schema; `details`: name, version) or `tool_name_taken` (a tool of the fleet; "
    "`details`: name)",
    413: "`payload_too_large`: the body or the plan is over its size limit",
    406: "`not_acceptable`: the response is JSON; accept `application/json`",
    415: "`unsupported_media_type`: send `application/json` (or `application/yaml` to "
    "`POST /runs`)",
    422: "`idempotency_key_reused`: this key was used with a different body",
    429: "`throttled`: too many requests for this key; `too_many_pending_runs`: the "
    "organization has as many runs waiting to start as it may; `too_many_uploads`; "
    "`too_many_streams` (an event stream past the organization's quota); "
    "`too_many_polls` (a runner poll that would be held past the organization's quota); "
    "`too_many_pending_deliveries`: the webhook endpoint has as many deliveries pending as "
    "a test or a redelivery may add to; see the `Retry-After` header",
    500: "`internal_error`",
    503: "`service_unavailable`: the database is briefly unreachable; retry after "
    "`Retry-After` seconds (nothing was changed)",
}
# Every response can be one of these (query parameters are validated everywhere).
READ_ERRORS = (400, 401, 403, 406, 429, 500, 503)
LIST_ERRORS = (*READ_ERRORS, 404)
WRITE_ERRORS = (*READ_ERRORS, 409, 413, 415, 422)


RETRY_AFTER_PARAMETER = OpenApiParameter(
    name="Retry-After",
    type=int,
    location=OpenApiParameter.HEADER,
    response=[429],
    description="Seconds to wait before the next request with this key.",
)


def error_responses(*statuses: int) -> dict[int, OpenApiResponse]:
    return {
        status: OpenApiResponse(ErrorOutput, description=ERROR_DESCRIPTIONS[status])
        for status in sorted(set(statuses))
    }
