"""Escalations over HTTP (docs/escalation.md): list and read a run's tickets, acknowledge
one, resolve one with an action. Every route is scoped to the key's organization:
another organization's ticket is 404. Each view validates its input and calls one
function of ``runs.people.escalations``.
"""

from __future__ import annotations

from typing import Any, ClassVar
from uuid import UUID

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from api.authentication import client_of, organization_of
from api.base import ApiView, page_response, validated
from api.errors import LIST_ERRORS, WRITE_ERRORS, error_responses
from api.idempotency import idempotent
from api.pagination import PageQuery, paginated
from api.serializers import InputSerializer, StrictCharField
from runs.models import EscalationReason, EscalationStatus, EscalationTicket, Resolution, Severity
from runs.people import escalations

TAG_ESCALATIONS = "escalations"


class EscalationErrorOutput(serializers.Serializer[Any]):
    """A failure that triggered the escalation, or came while it was open."""

    step = serializers.IntegerField(help_text="The step's id.")
    path = serializers.CharField(help_text="`agent.task.step`.")
    attempt = serializers.IntegerField(help_text="The step attempt that failed.")
    code = serializers.CharField()
    message = serializers.CharField()
    at = serializers.DateTimeField()


class EscalationOutput(serializers.Serializer[Any]):
    id = serializers.UUIDField()
    run = serializers.UUIDField(source="run_id")
    attempt_number = serializers.IntegerField(help_text="The run attempt that escalated.")
    status = serializers.ChoiceField(choices=EscalationStatus.choices)
    reason = serializers.ChoiceField(choices=EscalationReason.choices)
    severity = serializers.ChoiceField(choices=Severity.choices)
    # DRF's metaclass takes declared fields off the class: this does not shadow
    # Serializer.errors, whatever the type checker sees.
    errors = EscalationErrorOutput(many=True)  # type: ignore[assignment]
    opened_at = serializers.DateTimeField()
    acknowledged_at = serializers.DateTimeField(allow_null=True)
    acknowledged_by = serializers.CharField()
    resolved_at = serializers.DateTimeField(allow_null=True)
    resolved_by = serializers.CharField()
    resolution = serializers.CharField(
        help_text="resume, retry, replan or cancel; escalation_timeout or run_ended when "
        "the run ended otherwise; empty while unresolved."
    )
    note = serializers.CharField()
    notified_at = serializers.DateTimeField(
        allow_null=True, help_text="When on-call was told (every channel delivered or gave up)."
    )


EscalationPage = paginated(EscalationOutput, "PaginatedEscalationList")


class EscalationQuery(PageQuery):
    status = serializers.ChoiceField(
        choices=EscalationStatus.choices, required=False, help_text="open, acknowledged, resolved."
    )
    run = serializers.UUIDField(required=False, help_text="One run's tickets.")


class NoteInput(InputSerializer):
    note = StrictCharField(required=False, allow_blank=True, max_length=2000)


class ResolveInput(NoteInput):
    action = serializers.ChoiceField(
        choices=[str(action) for action in escalations.ACTIONS],
        help_text="resume: carry on, failed steps retried afresh; retry: a new attempt; "
        "replan: the failing agents replaced by the planner's; cancel: cancel and refund.",
    )


def _output(ticket: EscalationTicket) -> dict[str, Any]:
    return dict(EscalationOutput(ticket).data)


class EscalationsApi(ApiView):
    queries: ClassVar[dict[str, type[serializers.Serializer[Any]]]] = {"get": EscalationQuery}

    @extend_schema(
        tags=[TAG_ESCALATIONS],
        summary="List escalations",
        operation_id="escalations_list",
        parameters=[EscalationQuery],
        responses={200: EscalationPage, **error_responses(*LIST_ERRORS)},
    )
    def get(self, request: Request) -> Response:
        """The organization's escalation tickets, newest first."""
        rows = escalations.escalation_list(
            organization=organization_of(request),
            status=self.query.get("status"),
            run_id=self.query.get("run"),
        )
        return page_response(request, rows, self.query, EscalationOutput)


class EscalationApi(ApiView):
    @extend_schema(
        tags=[TAG_ESCALATIONS],
        summary="Show an escalation",
        operation_id="escalations_retrieve",
        responses={200: EscalationOutput, **error_responses(*LIST_ERRORS)},
    )
    def get(self, request: Request, escalation_id: UUID) -> Response:
        """One escalation ticket: why the run escalated and the errors that made it, and
        who acknowledged and resolved it, when and how."""
        ticket = escalations.escalation_get(
            organization=organization_of(request), ticket_id=escalation_id
        )
        return Response(_output(ticket))


class EscalationAcknowledgeApi(ApiView):
    @extend_schema(
        tags=[TAG_ESCALATIONS],
        summary="Acknowledge an escalation",
        operation_id="escalations_acknowledge",
        request=NoteInput,
        responses={200: EscalationOutput, **error_responses(*WRITE_ERRORS, 404)},
    )
    @idempotent
    def post(self, request: Request, escalation_id: UUID) -> Response:
        """open -> acknowledged (someone is on it). Twice: no change. Resolved: 409."""
        data = validated(NoteInput, request.data)
        client = client_of(request)
        ticket = escalations.escalation_acknowledge(
            ticket_id=escalation_id,
            organization=client.organization,
            actor=client.actor,
            note=data.get("note", ""),
        )
        return Response(_output(ticket))


class EscalationResolveApi(ApiView):
    @extend_schema(
        tags=[TAG_ESCALATIONS],
        summary="Resolve an escalation",
        operation_id="escalations_resolve",
        request=ResolveInput,
        responses={200: EscalationOutput, **error_responses(*WRITE_ERRORS, 402, 404)},
    )
    @idempotent
    def post(self, request: Request, escalation_id: UUID) -> Response:
        """Take the run out of ESCALATED with `action`. 409 `escalation_resolved` when it
        was resolved already, `attempts_exhausted` for a retry with none left,
        `replan_limit_reached` past `max_replans`; 402 for a retry without the credits."""
        data = validated(ResolveInput, request.data)
        client = client_of(request)
        ticket = escalations.escalation_resolve(
            ticket_id=escalation_id,
            action=Resolution(data["action"]),
            organization=client.organization,
            actor=client.actor,
            note=data.get("note", ""),
        )
        return Response(_output(ticket))
