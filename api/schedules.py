"""Run schedules over HTTP (docs/schedules.md): create, list, read, change and delete a
schedule; pause, resume and trigger it, as a run's actions are routes; read what became
of each of its due times. Every route is scoped to the key's organization: another
organization's schedule is 404. Each view validates its input's shape and calls one
function of ``schedules.services`` or ``schedules.selectors``, which check the rest
(cron, interval, time zone, the plan) and store nothing on a problem.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any, ClassVar, TypeVar
from uuid import UUID

from django.urls import reverse
from drf_spectacular.extensions import OpenApiSerializerFieldExtension
from drf_spectacular.utils import OpenApiExample, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from api.authentication import client_of, organization_of
from api.base import ApiView, page_response, validated
from api.errors import LIST_ERRORS, READ_ERRORS, WRITE_ERRORS, error_responses
from api.idempotency import IDEMPOTENCY_PARAMETER, REPLAYED_PARAMETER, idempotent
from api.pagination import PageQuery, paginated
from api.parsers import BoundedJSONParser, BoundedYAMLParser, plan_size_hint
from api.query_parameters import filter_parameters
from api.schema import PlanField
from api.serializers import EmptyInput, InputSerializer, StrictCharField
from runs.plan import format_duration_ms
from runs.plan.durations import DURATION_HELP, DURATION_RE
from runs.states import RunStatus
from schedules import selectors, services
from schedules.filters import ScheduleFilter
from schedules.models import (
    CRON_MAX_LENGTH,
    NAME_MAX_LENGTH,
    TIMEZONE_MAX_LENGTH,
    Catchup,
    FireKind,
    FireStatus,
    Overlap,
    PausedReason,
    Schedule,
    ScheduleFire,
    ScheduleStatus,
    SkipReason,
)

TAG_SCHEDULES = "schedules"

EXAMPLE_CREATE = {
    "name": "nightly-report",
    "plan": {
        "name": "report",
        "agents": [
            {
                "name": "writer",
                "tasks": [
                    {
                        "name": "write",
                        "steps": [
                            {"name": "draft", "tool": "echo", "params": {"day": "${variables.day}"}}
                        ],
                    }
                ],
            }
        ],
    },
    "cron": "30 2 * * *",
    "timezone": "Europe/Paris",
    "overlap": "skip",
    "catchup": "latest",
    "variables": {"day": "yesterday"},
}


# --------------------------------------------------------------------------- fields
class IntervalField(serializers.Field):  # type: ignore[type-arg]
    """An interval in the plans' duration syntax (``"30s"``, ``"5m"``, ``"1.5h"``, or a
    number of seconds); its bounds are the service's to check."""

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, bool) or not isinstance(data, str | int | float):
            raise serializers.ValidationError(
                "must be a duration such as '30s' or '5m', or a number of seconds",
                code="invalid_interval",
            )
        return data

    def to_representation(self, value: Any) -> Any:
        return value


class IntervalFieldExtension(OpenApiSerializerFieldExtension):  # type: ignore[no-untyped-call]
    target_class = IntervalField

    def map_serializer_field(self, auto_schema: Any, direction: Any) -> dict[str, Any]:
        return {
            "oneOf": [
                {"type": "string", "pattern": f"^{DURATION_RE.pattern}$"},
                {"type": "number", "minimum": 0, "exclusiveMinimum": True},
            ],
            "description": f"{DURATION_HELP} At least 1s.",
        }


class StrictDateTimeField(serializers.DateTimeField):
    """An ISO 8601 date-time; one whose offset takes it outside the calendar (year 1 at
    +01:00) is refused like a malformed one, not a 500."""

    def enforce_timezone(self, value: datetime) -> datetime:
        try:
            return super().enforce_timezone(value)
        except OverflowError:
            self.fail("invalid", format="ISO 8601")


# --------------------------------------------------------------------------- inputs
CRON_HELP = (
    "Five fields, minute hour day-of-month month day-of-week (`30 2 * * *`, `*/15 9-17 * * "
    "mon-fri`), or `@hourly`, `@daily`, `@weekly`, `@monthly`, `@yearly`; in `timezone`. "
    "Give `cron` or `interval`."
)
TIMEZONE_HELP = "An IANA time zone name (`UTC`, `Europe/Paris`): where `cron` is read."


class ScheduleFields(InputSerializer):
    """The fields a schedule is written with; a create requires `name` and `plan`."""

    name = StrictCharField(max_length=NAME_MAX_LENGTH)
    plan = PlanField(help_text="The plan each run gets; validated completely when stored.")
    cron = StrictCharField(max_length=CRON_MAX_LENGTH, required=False, help_text=CRON_HELP)
    interval = IntervalField(
        required=False, help_text=f"Every so long from the anchor. {DURATION_HELP}"
    )
    timezone = StrictCharField(
        max_length=TIMEZONE_MAX_LENGTH, required=False, help_text=TIMEZONE_HELP
    )
    start_at = StrictDateTimeField(
        required=False,
        allow_null=True,
        help_text="The anchor and the first possible due time (default: the creation, "
        "which is not itself due).",
    )
    end_at = StrictDateTimeField(
        required=False, allow_null=True, help_text="No due time after it (default: none)."
    )
    overlap = serializers.ChoiceField(
        choices=Overlap.choices,
        required=False,
        help_text="While the previous run has not ended: `skip` the due time (default), "
        "`allow` another run, or `cancel_previous`.",
    )
    catchup = serializers.ChoiceField(
        choices=Catchup.choices,
        required=False,
        help_text="Due times missed while no tick ran: `none` (default), `latest` (one run "
        "for them), `all` (each, up to SCHEDULES_CATCHUP_MAX).",
    )
    variables = serializers.DictField(
        required=False, help_text="Laid over the plan's own `variables` for each run."
    )


class ScheduleCreateInput(ScheduleFields):
    """A new schedule: `name`, `plan`, and `cron` or `interval`."""


class ScheduleUpdateInput(ScheduleFields):
    """The fields to change; the others keep their values. `cron` replaces an interval,
    `interval` a cron; `start_at` and `end_at` take null."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for field in self.fields.values():
            field.required = False


# The body's names as the services' keyword arguments.
SERVICE_NAMES = {"timezone": "timezone_name"}


def _service_fields(data: dict[str, Any]) -> dict[str, Any]:
    return {SERVICE_NAMES.get(name, name): value for name, value in data.items()}


# --------------------------------------------------------------------------- outputs
class RunRefOutput(serializers.Serializer[Any]):
    id = serializers.UUIDField()
    status = serializers.ChoiceField(choices=RunStatus.choices)


class ScheduleOutput(serializers.Serializer[Any]):
    """A schedule as lists show it (without its plan)."""

    id = serializers.UUIDField()
    name = serializers.CharField()
    status = serializers.ChoiceField(
        choices=ScheduleStatus.choices,
        help_text="active; paused; ended when no due time is left (past `end_at`).",
    )
    cron = serializers.CharField(allow_null=True, help_text="Null for an interval schedule.")
    interval = serializers.CharField(
        allow_null=True, help_text="As a duration (`90s` reads `90s`); null for a cron."
    )
    timezone = serializers.CharField()
    start_at = serializers.DateTimeField(allow_null=True)
    end_at = serializers.DateTimeField(allow_null=True)
    overlap = serializers.ChoiceField(choices=Overlap.choices)
    catchup = serializers.ChoiceField(choices=Catchup.choices)
    variables = serializers.DictField()
    next_due_at = serializers.DateTimeField(
        allow_null=True,
        help_text="The next due time (overdue while a tick has not reached it); null once "
        "ended. While paused: where it stood when paused.",
    )
    last_due_at = serializers.DateTimeField(
        allow_null=True, help_text="The latest due time handled, fired or skipped."
    )
    last_run = RunRefOutput(
        allow_null=True,
        help_text="The run of the latest fire that started one (a due time or a trigger).",
    )
    paused_at = serializers.DateTimeField(allow_null=True)
    paused_reason = serializers.ChoiceField(
        choices=PausedReason.choices,
        allow_null=True,
        help_text="Why it is paused: `manual` (paused through the API or the admin), or "
        "`insufficient_credits` (it paused itself: its runs were refused for credits at "
        "10 due times in a row; resume it once credits are there); null while not paused.",
    )
    created_by = serializers.CharField()
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()


class ScheduleDetailOutput(ScheduleOutput):
    """A schedule with its plan."""

    plan = serializers.JSONField(help_text="The plan exactly as submitted.")


class FireOutput(serializers.Serializer[Any]):
    """A due time handled (or a trigger): fired with its run, or skipped with the reason."""

    id = serializers.IntegerField()
    schedule = serializers.UUIDField()
    kind = serializers.ChoiceField(
        choices=FireKind.choices, help_text="scheduled (a due time) or manual (a trigger)."
    )
    due_at = serializers.DateTimeField(help_text="The due time; a trigger's: when asked.")
    status = serializers.ChoiceField(choices=FireStatus.choices)
    reason = serializers.CharField(
        help_text=f"Why it was skipped: {', '.join(SkipReason.values)}; empty when fired."
    )
    message = serializers.CharField()
    run = RunRefOutput(allow_null=True, help_text="The run it started; null when skipped.")
    created_at = serializers.DateTimeField(help_text="When it was handled.")


SchedulePage = paginated(ScheduleOutput, "PaginatedScheduleList")
FirePage = paginated(FireOutput, "PaginatedFireList")


def _run_ref(run_id: Any, status: Any) -> dict[str, Any] | None:
    return None if run_id is None else {"id": run_id, "status": status}


def schedule_row(schedule: Schedule, *, plan: bool = True) -> dict[str, Any]:
    """The schedule as its output shows it (``selectors.with_last_run`` annotates it)."""
    row = {
        "id": schedule.pk,
        "name": schedule.name,
        "status": schedule.status,
        "cron": schedule.cron or None,
        "interval": format_duration_ms(schedule.interval_ms) if schedule.interval_ms else None,
        "timezone": schedule.timezone,
        "start_at": schedule.start_at,
        "end_at": schedule.end_at,
        "overlap": schedule.overlap,
        "catchup": schedule.catchup,
        "variables": schedule.variables,
        "next_due_at": schedule.next_due_at,
        "last_due_at": schedule.last_due_at,
        "last_run": _run_ref(
            getattr(schedule, "last_run_id", None), getattr(schedule, "last_run_status", None)
        ),
        "paused_at": schedule.paused_at,
        "paused_reason": (schedule.paused_reason or PausedReason.MANUAL)
        if schedule.paused_at is not None
        else None,
        "created_by": schedule.created_by,
        "created_at": schedule.created_at,
        "updated_at": schedule.updated_at,
    }
    if plan:
        row["plan"] = schedule.plan
    return row


def fire_row(fire: ScheduleFire) -> dict[str, Any]:
    return {
        "id": fire.pk,
        "schedule": fire.schedule_id,
        "kind": fire.kind,
        "due_at": fire.due_at,
        "status": fire.status,
        "reason": fire.reason,
        "message": fire.message,
        "run": _run_ref(fire.run_id, fire.run.status if fire.run_id and fire.run else None),
        "created_at": fire.created_at,
    }


def detail_response(request: Request, schedule_id: UUID, status: int = 200) -> Response:
    """The schedule as ``GET /schedules/{id}`` shows it, read again (with its last run)."""
    schedule = selectors.schedule_get(
        organization=organization_of(request), schedule_id=schedule_id
    )
    return Response(ScheduleDetailOutput(schedule_row(schedule)).data, status=status)


POST_PARAMETERS = [IDEMPOTENCY_PARAMETER, REPLAYED_PARAMETER]
Handler = TypeVar("Handler", bound=Callable[..., Response])


def action_schema(summary: str, operation_id: str, **extra: Any) -> Callable[[Handler], Handler]:
    return extend_schema(
        tags=[TAG_SCHEDULES],
        summary=summary,
        operation_id=operation_id,
        request=EmptyInput,
        parameters=POST_PARAMETERS,
        responses={
            200: extra.pop("response", ScheduleDetailOutput),
            **error_responses(*WRITE_ERRORS, 404, *extra.pop("errors", ())),
        },
        **extra,
    )


# --------------------------------------------------------------------------- /schedules
class SchedulesApi(ApiView):
    queries: ClassVar[dict[str, type[serializers.Serializer[Any]]]] = {"get": PageQuery}
    filterset = ScheduleFilter
    # A plan may be sent as YAML too (`Content-Type: application/yaml`), as the CLI does.
    parser_classes = (BoundedJSONParser, BoundedYAMLParser)

    @extend_schema(
        tags=[TAG_SCHEDULES],
        operation_id="schedules_list",
        summary="List schedules",
        parameters=[PageQuery, *filter_parameters(ScheduleFilter)],
        responses={200: SchedulePage, **error_responses(*LIST_ERRORS)},
    )
    def get(self, request: Request) -> Response:
        """Your organization's schedules, newest first, with their next and last due
        times and last run."""
        rows = selectors.schedule_list(organization=organization_of(request), query=self.filters)
        return page_response(
            request,
            rows,
            self.query,
            lambda page, many: ScheduleOutput(
                [schedule_row(schedule, plan=False) for schedule in page], many=many
            ),
        )

    @extend_schema(
        tags=[TAG_SCHEDULES],
        operation_id="schedules_create",
        summary="Create a schedule",
        request=ScheduleCreateInput,
        parameters=POST_PARAMETERS,
        examples=[OpenApiExample("Every night at 02:30 in Paris", value=EXAMPLE_CREATE)],
        responses={201: ScheduleDetailOutput, **error_responses(*WRITE_ERRORS)},
    )
    @idempotent
    def post(self, request: Request) -> Response:
        """Create a schedule: its plan run by `cron` (in `timezone`) or every `interval`
        (from `start_at`, or from now). Everything is checked first, the plan with its
        variables as its runs will get it; on any problem nothing is stored (400
        `invalid_request` naming the field and its code, or `invalid_plan` with the
        paths in the plan; 409 `quota_exceeded` when your organization has as many
        schedules as its quota)."""
        data = validated(ScheduleCreateInput, request.data)
        client = client_of(request)
        length = None if "yaml" in request.content_type else request.META.get("CONTENT_LENGTH")
        schedule = services.schedule_create(
            organization=client.organization,
            actor=client.actor,
            size_hint=plan_size_hint(data["plan"], length),
            **_service_fields(data),
        )
        response = Response(ScheduleDetailOutput(schedule_row(schedule)).data, status=201)
        response["Location"] = reverse("api:schedule", kwargs={"schedule_id": schedule.pk})
        return response


class ScheduleApi(ApiView):
    parser_classes = (BoundedJSONParser, BoundedYAMLParser)

    @extend_schema(
        tags=[TAG_SCHEDULES],
        operation_id="schedules_retrieve",
        summary="Get a schedule",
        responses={200: ScheduleDetailOutput, **error_responses(404, *READ_ERRORS)},
    )
    def get(self, request: Request, schedule_id: UUID) -> Response:
        """One schedule: its plan, timing and policies, next and last due time, and its
        last run with that run's status."""
        return detail_response(request, schedule_id)

    @extend_schema(
        tags=[TAG_SCHEDULES],
        operation_id="schedules_update",
        summary="Change a schedule",
        request=ScheduleUpdateInput,
        responses={200: ScheduleDetailOutput, **error_responses(*WRITE_ERRORS, 404)},
    )
    def patch(self, request: Request, schedule_id: UUID) -> Response:
        """Change the fields given. A change of timing (`cron`, `interval`, `timezone`,
        `start_at`, `end_at`) takes effect from now: the next due time is the first after
        now by the new timing. Runs already started are not touched."""
        data = validated(ScheduleUpdateInput, request.data)
        length = None if "yaml" in request.content_type else request.META.get("CONTENT_LENGTH")
        size_hint = plan_size_hint(data["plan"], length) if "plan" in data else None
        services.schedule_update(
            schedule_id=schedule_id,
            organization=organization_of(request),
            size_hint=size_hint,
            **_service_fields(data),
        )
        return detail_response(request, schedule_id)

    @extend_schema(
        tags=[TAG_SCHEDULES],
        operation_id="schedules_delete",
        summary="Delete a schedule",
        responses={204: None, **error_responses(404, *READ_ERRORS)},
    )
    def delete(self, request: Request, schedule_id: UUID) -> Response:
        """Delete the schedule and the record of its fires; its runs stay (no longer
        found by `?schedule=`). Again: 404."""
        services.schedule_delete(schedule_id=schedule_id, organization=organization_of(request))
        return Response(status=204)


class SchedulePauseApi(ApiView):
    @action_schema("Pause a schedule", "schedules_pause")
    @idempotent
    def post(self, request: Request, schedule_id: UUID) -> Response:
        """Stop firing; due times while paused are neither run nor recorded. Runs already
        started go on. Pausing a paused schedule changes nothing."""
        validated(EmptyInput, request.data)
        services.schedule_pause(schedule_id=schedule_id, organization=organization_of(request))
        return detail_response(request, schedule_id)


class ScheduleResumeApi(ApiView):
    @action_schema("Resume a schedule", "schedules_resume")
    @idempotent
    def post(self, request: Request, schedule_id: UUID) -> Response:
        """Fire again, from the first due time after now (those passed while paused are
        not caught up). Resuming an active schedule changes nothing."""
        validated(EmptyInput, request.data)
        services.schedule_resume(schedule_id=schedule_id, organization=organization_of(request))
        return detail_response(request, schedule_id)


class ScheduleTriggerApi(ApiView):
    @action_schema(
        "Run a schedule now",
        "schedules_trigger",
        response=FireOutput,
        errors=(402,),
    )
    @idempotent
    def post(self, request: Request, schedule_id: UUID) -> Response:
        """Start a run of the schedule's plan now, outside its due times (paused or ended
        as it may be): a `manual` fire with its run. `overlap: cancel_previous` cancels
        its runs still going first. Refused as a run's start is (402
        `insufficient_credits`, 429 `too_many_pending_runs`), and then nothing is
        recorded."""
        validated(EmptyInput, request.data)
        client = client_of(request)
        fire = services.schedule_trigger(
            schedule_id=schedule_id, organization=client.organization, actor=client.actor
        )
        return Response(FireOutput(fire_row(fire)).data)


class ScheduleFiresApi(ApiView):
    queries: ClassVar[dict[str, type[serializers.Serializer[Any]]]] = {"get": PageQuery}

    @extend_schema(
        tags=[TAG_SCHEDULES],
        operation_id="schedules_fires",
        summary="List what became of a schedule's due times",
        parameters=[PageQuery],
        responses={200: FirePage, **error_responses(*LIST_ERRORS)},
    )
    def get(self, request: Request, schedule_id: UUID) -> Response:
        """Each due time handled and each trigger, newest first: fired with its run and
        the run's status, or skipped with the reason (`overlap`, `missed` standing for
        every time missed at once, `insufficient_credits`, `too_many_pending_runs`,
        `invalid_plan`, `suspended`) and a message."""
        schedule = selectors.schedule_get(
            organization=organization_of(request), schedule_id=schedule_id
        )
        fires = selectors.fire_list(schedule=schedule)
        return page_response(
            request,
            fires,
            self.query,
            lambda page, many: FireOutput([fire_row(fire) for fire in page], many=many),
        )
