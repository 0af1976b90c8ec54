"""The runs API (`/api/v1/runs...`): create, list and read runs, their control actions
(start, cancel, pause, resume, retry, approve, reject) and their agents, tasks, steps
and events; one method per operation, each validating its input and calling one service
or selector. Another organization's run is "not found" (404), never 403.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from uuid import UUID

from django.db import transaction
from django.urls import reverse
from drf_spectacular.utils import (
    OpenApiExample,
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
)
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from api.authentication import client_of, organization_of
from api.base import POST_PARAMETERS, ApiView, Handler, list_schema, page_response, validated
from api.errors import (
    LIST_ERRORS,
    READ_ERRORS,
    RETRY_AFTER_PARAMETER,
    WRITE_ERRORS,
    error_responses,
)
from api.idempotency import idempotent
from api.pagination import (
    Cursor,
    CursorQuery,
    PageQuery,
    cursor_paginated,
    paginate,
    paginate_by_id,
    paginate_counted,
    paginated,
)
from api.parsers import (
    BoundedJSONParser,
    BoundedYAMLParser,
    plan_size_hint,
)
from api.query_parameters import CommaSeparatedChoices, filter_parameters
from api.schema import PlanField
from api.serializers import (
    AgentOutput,
    ApprovalOutput,
    EmptyInput,
    EventOutput,
    InputSerializer,
    RunDetailOutput,
    RunOutput,
    StepOutput,
    StrictBooleanField,
    StrictCharField,
    StrictIntegerField,
    TaskOutput,
)
from common.filters import MAX_BIGINT
from runs import selectors, services
from runs.engine.start import run_start
from runs.filters import AgentFilter, EventFilter, StepFilter, TaskFilter
from runs.people import approvals
from runs.people.approvals import ApprovalResult
from runs.reuse import REUSE_CHOICES
from schedules import selectors as schedule_selectors
from schedules.filters import ScheduledRunFilter

TAG_RUNS = "runs"

EXAMPLE_CREATE = {
    "plan": {
        "name": "market-research",
        "priority": 3,
        "variables": {"topic": "AI chips"},
        "agents": [
            {
                "name": "researcher",
                "tasks": [
                    {
                        "name": "gather",
                        "steps": [
                            {
                                "name": "search",
                                "tool": "echo",
                                "params": {"q": "${variables.topic}"},
                            },
                            {"name": "summarise", "tool": "noop"},
                        ],
                    }
                ],
            }
        ],
    },
    "start": True,
}

LOCATION_PARAMETER = OpenApiParameter(
    name="Location",
    type=str,
    location=OpenApiParameter.HEADER,
    response=[201],
    description="The new run's URL.",
)

RunPage = paginated(RunOutput, "PaginatedRunList")
AgentPage = paginated(AgentOutput, "PaginatedAgentList")
TaskPage = paginated(TaskOutput, "PaginatedTaskList")
StepPage = paginated(StepOutput, "PaginatedStepList")
EventPage = cursor_paginated(EventOutput, "CursorPaginatedEventList")


def detail_response(request: Request, run_id: UUID, status: int = 200) -> Response:
    detail = selectors.run_detail(organization=organization_of(request), run_id=run_id)
    return Response(RunDetailOutput.row(detail), status=status)


def action_schema(
    summary: str, request: Any = EmptyInput, **extra: Any
) -> Callable[[Handler], Handler]:
    """The schema of a POST control action on one run."""
    return extend_schema(
        tags=[TAG_RUNS],
        summary=summary,
        request=request,
        parameters=POST_PARAMETERS,
        responses={
            200: extra.pop("response", RunDetailOutput),
            **error_responses(*WRITE_ERRORS, 404, *extra.pop("errors", ())),
        },
        **extra,
    )


# --------------------------------------------------------------------------- /runs
class RunsApi(ApiView):
    class CreateInput(InputSerializer):
        """A plan, and whether to start the run at once."""

        plan = PlanField(
            help_text="The run's plan; validated completely before anything is stored."
        )
        start = StrictBooleanField(
            default=False, help_text="Also start the run (reserve credits and enqueue it)."
        )

    queries = {"get": PageQuery}
    # The runs' filters and `schedule` (the runs a schedule started: schedules.filters).
    filterset = ScheduledRunFilter
    # A plan may be sent as YAML too (`Content-Type: application/yaml`), as the CLI does.
    parser_classes = (BoundedJSONParser, BoundedYAMLParser)

    @extend_schema(
        tags=[TAG_RUNS],
        operation_id="runs_list",
        summary="List runs",
        parameters=[PageQuery, *filter_parameters(ScheduledRunFilter), RETRY_AFTER_PARAMETER],
        responses={200: RunPage, **error_responses(*LIST_ERRORS)},
    )
    def get(self, request: Request) -> Response:
        """Your organization's runs, newest first unless `ordering` says otherwise;
        deleted runs are not listed. `schedule`: the runs that schedule started."""
        organization = organization_of(request)
        page, page_size = self.query.get("page"), self.query.get("page_size")
        if set(self.filters) == {"status"}:  # the most asked list: one statement
            statuses = self.filters.getlist("status")

            def read(limit: int, offset: int) -> tuple[int | None, list[Any]]:
                return selectors.runs_by_status(
                    organization=organization, statuses=statuses, limit=limit, offset=offset
                )

            envelope, rows = paginate_counted(request, read, page=page, page_size=page_size)
        else:
            runs = schedule_selectors.run_list(organization=organization, query=self.filters)
            listed = selectors.run_rows(runs)
            envelope, rows = paginate(request, listed, page=page, page_size=page_size)
            selectors.attach_credits(rows)
        return Response({**envelope, "results": RunOutput.rows(rows)})

    @extend_schema(
        tags=[TAG_RUNS],
        operation_id="runs_create",
        summary="Create a run",
        request=CreateInput,
        parameters=[*POST_PARAMETERS, LOCATION_PARAMETER],
        examples=[
            OpenApiExample("Create and start a small run", value=EXAMPLE_CREATE, request_only=True)
        ],
        responses={
            201: RunDetailOutput,
            200: OpenApiResponse(RunDetailOutput, description="A replay (same Idempotency-Key)."),
            **error_responses(*WRITE_ERRORS, 402),
        },
    )
    @idempotent
    def post(self, request: Request) -> Response:
        """Create a run from a plan (CREATED); with `"start": true` also start it. Without
        enough credits to start (402), or with as many runs waiting to start as the
        organization may have (429 `too_many_pending_runs`), nothing is created."""
        data = validated(self.CreateInput, request.data)
        client = client_of(request)
        # A YAML body is no measure of the plan's JSON size: measure the plan itself.
        length = None if "yaml" in request.content_type else request.META.get("CONTENT_LENGTH")
        size_hint = plan_size_hint(data["plan"], length)
        with transaction.atomic():
            run, plan = services.run_create_checked(
                organization=client.organization,
                plan=data["plan"],
                actor=client.actor,
                size_hint=size_hint,
            )
            if data["start"]:
                run_start(
                    run_id=run.pk, organization=client.organization, actor=client.actor, plan=plan
                )
        if data["start"]:
            response = detail_response(request, run.pk, status=201)
        else:  # just created: its detail is the row in hand (no re-read, make profile-api)
            response = Response(RunDetailOutput.row(selectors.created_run_detail(run)), 201)
        response["Location"] = reverse("api:run", kwargs={"run_id": run.pk})
        return response


class RunDetailQuery(serializers.Serializer[Any]):
    exclude = CommaSeparatedChoices(selectors.DETAIL_EXCLUDABLE, required=False)


EXCLUDE_PARAMETER = OpenApiParameter(
    name="exclude",
    type={"type": "array", "items": {"type": "string", "enum": list(selectors.DETAIL_EXCLUDABLE)}},
    location=OpenApiParameter.QUERY,
    style="form",
    explode=False,
    required=False,
    description="Parts of the run to leave out, comma-separated: `plan`, and `outputs` "
    "(with `outputs_truncated`). A status poll of `?exclude=outputs,plan` stays a few KB "
    "whatever the size of the run.",
)


class RunApi(ApiView):
    queries = {"get": RunDetailQuery}

    @extend_schema(
        tags=[TAG_RUNS],
        operation_id="runs_retrieve",
        parameters=[EXCLUDE_PARAMETER, RETRY_AFTER_PARAMETER],
        summary="Get a run",
        responses={200: RunDetailOutput, **error_responses(404, *READ_ERRORS)},
    )
    def get(self, request: Request, run_id: UUID) -> Response:
        """One run: attempt, counts and progress of the current attempt, credits, last error,
        its plan and its steps' outputs (unless `exclude` leaves them out)."""
        exclude = self.query.get("exclude", ())
        detail = selectors.run_detail(
            organization=organization_of(request), run_id=run_id, exclude=exclude
        )
        return Response(RunDetailOutput.row(detail))

    @extend_schema(
        tags=[TAG_RUNS],
        operation_id="runs_delete",
        parameters=[RETRY_AFTER_PARAMETER],
        summary="Delete a run",
        responses={204: None, **error_responses(404, 409, *READ_ERRORS)},
    )
    def delete(self, request: Request, run_id: UUID) -> Response:
        """Soft delete, only while CREATED (409 `invalid_transition` otherwise): the run is
        cancelled and no longer listed. Deleting it again changes nothing."""
        client = client_of(request)
        services.run_delete(run_id=run_id, organization=client.organization, actor=client.actor)
        return Response(status=204)


# --------------------------------------------------------------------------- control
class RunStartApi(ApiView):
    @action_schema("Start a run", operation_id="runs_start", errors=(402,))
    @idempotent
    def post(self, request: Request, run_id: UUID) -> Response:
        """CREATED -> PENDING: reserve the run's credits (402 without enough) and enqueue
        it; 429 `too_many_pending_runs` when the organization has as many runs waiting to
        start as it may (nothing changes). Starting a PENDING run changes nothing."""
        validated(EmptyInput, request.data)
        client = client_of(request)
        run_start(run_id=run_id, organization=client.organization, actor=client.actor)
        return detail_response(request, run_id)


class RunCancelApi(ApiView):
    class CancelInput(InputSerializer):
        """Why: kept as the run's `cancel_reason` and in its events."""

        reason = StrictCharField(required=False, allow_blank=True, max_length=1000)

    @action_schema("Cancel a run", request=CancelInput, operation_id="runs_cancel")
    @idempotent
    def post(self, request: Request, run_id: UUID) -> Response:
        """Cancel from any non-terminal state: running steps are stopped, unused credits
        refunded. Cancelling a cancelled run changes nothing."""
        data = validated(self.CancelInput, request.data)
        client = client_of(request)
        services.run_cancel(
            run_id=run_id,
            reason=data.get("reason", ""),
            organization=client.organization,
            actor=client.actor,
        )
        return detail_response(request, run_id)


class RunPauseApi(ApiView):
    @action_schema("Pause a run", operation_id="runs_pause")
    @idempotent
    def post(self, request: Request, run_id: UUID) -> Response:
        """RUNNING -> PAUSED: nothing new starts; running steps finish and keep results."""
        validated(EmptyInput, request.data)
        client = client_of(request)
        services.run_pause(run_id=run_id, organization=client.organization, actor=client.actor)
        return detail_response(request, run_id)


class RunResumeApi(ApiView):
    @action_schema("Resume a run", operation_id="runs_resume")
    @idempotent
    def post(self, request: Request, run_id: UUID) -> Response:
        """PAUSED -> RESUMING -> RUNNING: paused work is pending again and re-dispatched."""
        validated(EmptyInput, request.data)
        client = client_of(request)
        services.run_resume(run_id=run_id, organization=client.organization, actor=client.actor)
        return detail_response(request, run_id)


class RunRetryApi(ApiView):
    class RetryInput(InputSerializer):
        """What the new attempt takes from the one that ended."""

        reuse = serializers.ChoiceField(
            choices=REUSE_CHOICES,
            required=False,
            default="none",
            help_text="`none`: every step runs again. `completed`: the steps the ended "
            "attempt completed are taken as completed, with their output (`reused_from`), "
            "neither run nor charged again; the reservation covers the rest.",
        )

    @action_schema(
        "Retry a failed run", request=RetryInput, operation_id="runs_retry", errors=(402,)
    )
    @idempotent
    def post(self, request: Request, run_id: UUID) -> Response:
        """FAILED -> RETRYING: a new attempt with a new reservation (402 without enough);
        409 `attempts_exhausted` once `max_attempts` are used."""
        data = validated(self.RetryInput, request.data)
        client = client_of(request)
        services.run_retry(
            run_id=run_id,
            organization=client.organization,
            actor=client.actor,
            reuse=data["reuse"],
        )
        return detail_response(request, run_id)


class DecisionInput(InputSerializer):
    """Which waiting step (all when omitted), and a comment kept with the decision."""

    step_id = StrictIntegerField(
        required=False,
        min_value=1,
        max_value=MAX_BIGINT,
        help_text="One waiting step; all waiting steps when omitted.",
    )
    comment = StrictCharField(required=False, allow_blank=True, max_length=2000)


def _decision_response(request: Request, run_id: UUID, result: ApprovalResult) -> Response:
    detail = selectors.run_detail(organization=organization_of(request), run_id=run_id)
    return Response(
        ApprovalOutput({"run": detail, "steps": [step.pk for step in result.steps]}).data
    )


class RunApproveApi(ApiView):
    @action_schema(
        "Approve waiting steps",
        request=DecisionInput,
        response=ApprovalOutput,
        operation_id="runs_approve",
    )
    @idempotent
    def post(self, request: Request, run_id: UUID) -> Response:
        """Complete the steps waiting for approval (one with `step_id`, else all); the run
        moves on. Nothing waiting: a no-op (`steps` is empty)."""
        data = validated(DecisionInput, request.data)
        client = client_of(request)
        result = approvals.run_approve(
            run_id=run_id,
            step_id=data.get("step_id"),
            comment=data.get("comment", ""),
            organization=client.organization,
            actor=client.actor,
        )
        return _decision_response(request, run_id, result)


class RunRejectApi(ApiView):
    @action_schema(
        "Reject waiting steps",
        request=DecisionInput,
        response=ApprovalOutput,
        operation_id="runs_reject",
    )
    @idempotent
    def post(self, request: Request, run_id: UUID) -> Response:
        """Fail the steps waiting for approval with `approval_rejected`; the run follows
        its failure mode. Nothing waiting: a no-op."""
        data = validated(DecisionInput, request.data)
        client = client_of(request)
        result = approvals.run_reject(
            run_id=run_id,
            step_id=data.get("step_id"),
            comment=data.get("comment", ""),
            organization=client.organization,
            actor=client.actor,
        )
        return _decision_response(request, run_id, result)


# --------------------------------------------------------------------------- hierarchy
class RunAgentsApi(ApiView):
    queries = {"get": PageQuery}
    filterset = AgentFilter

    @list_schema(
        "List a run's agents", PageQuery, AgentFilter, AgentPage, "runs_agents", tag=TAG_RUNS
    )
    def get(self, request: Request, run_id: UUID) -> Response:
        """The agents of one attempt of the run (the current one unless `attempt` says)."""
        run = selectors.run_get(organization=organization_of(request), run_id=run_id)
        agents = selectors.agent_list(run=run, query=self.filters)
        return page_response(request, agents, self.query, AgentOutput)


class RunTasksApi(ApiView):
    queries = {"get": PageQuery}
    filterset = TaskFilter

    @list_schema("List a run's tasks", PageQuery, TaskFilter, TaskPage, "runs_tasks", tag=TAG_RUNS)
    def get(self, request: Request, run_id: UUID) -> Response:
        """The tasks of one attempt of the run (the current one unless `attempt` says)."""
        run = selectors.run_get(organization=organization_of(request), run_id=run_id)
        tasks = selectors.task_list(run=run, query=self.filters)
        return page_response(request, tasks, self.query, TaskOutput)


class RunStepsApi(ApiView):
    queries = {"get": PageQuery}
    filterset = StepFilter

    @list_schema("List a run's steps", PageQuery, StepFilter, StepPage, "runs_steps", tag=TAG_RUNS)
    def get(self, request: Request, run_id: UUID) -> Response:
        """The steps of one attempt of the run (the current one unless `attempt` says), with
        their output, error and cost."""
        run = selectors.run_get(organization=organization_of(request), run_id=run_id)

        def read(limit: int, offset: int) -> tuple[int | None, list[Any]]:
            return selectors.steps_page(
                run=run, query=self.filter_values, limit=limit, offset=offset
            )

        page, page_size = self.query.get("page"), self.query.get("page_size")
        envelope, rows = paginate_counted(request, read, page=page, page_size=page_size)
        return Response({**envelope, "results": StepOutput.rows(rows)})


class RunEventsApi(ApiView):
    queries = {"get": CursorQuery}
    filterset = EventFilter

    @list_schema(
        "List a run's events", CursorQuery, EventFilter, EventPage, "runs_events", tag=TAG_RUNS
    )
    def get(self, request: Request, run_id: UUID) -> Response:
        """The run's history, oldest first: transitions, retries, charges, approvals.
        Pages by cursor: follow `next` until it is null (no `count`, no `page`)."""
        run = selectors.run_get(organization=organization_of(request), run_id=run_id)

        def read(cursor: Cursor | None, limit: int) -> list[dict[str, Any]]:
            if cursor is None or not cursor.before:
                after = 0 if cursor is None else cursor.key
                return selectors.events_page(
                    run=run, query=self.filter_values, after=after, limit=limit
                )
            return selectors.events_page(
                run=run, query=self.filter_values, before=cursor.key, limit=limit
            )

        cursor, page_size = self.query.get("cursor"), self.query.get("page_size")
        envelope, rows = paginate_by_id(request, read, cursor=cursor, page_size=page_size)
        return Response({**envelope, "results": EventOutput.rows(rows)})
