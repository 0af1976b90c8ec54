"""The published tools an organization may name in its plans (docs/tools.md): the fleet's
and its own workers', each with its current version's schema, its versions, and who
offers it now. Reads only, with a `read` or `full` key."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_field
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from api.authentication import organization_of
from api.base import ApiView, page_response
from api.errors import LIST_ERRORS, error_responses
from api.pagination import PageQuery, paginated
from runs import catalogue
from runs.models import PublishedTool

TAG_TOOLS = "tools"


class ToolVersionOutput(serializers.Serializer[Any]):
    version = serializers.CharField()
    published_at = serializers.DateTimeField(help_text="When this version was first published.")
    last_published_at = serializers.DateTimeField(
        help_text="When a worker last published it (at its start or registration)."
    )


class OfferOutput(serializers.Serializer[Any]):
    """Who offers a tool: a fleet worker that published it at its start, or an online
    runner (an `orch worker`) of the organization that registered with it."""

    placement = serializers.ChoiceField(choices=["fleet", "worker"])
    version = serializers.CharField()
    worker = serializers.CharField(help_text="The fleet worker's hostname, or the runner's id.")
    hostname = serializers.CharField()
    tags = serializers.ListField(child=serializers.CharField())
    since = serializers.DateTimeField()


class ToolOutput(serializers.Serializer[Any]):
    name = serializers.CharField(help_text="What a step names in `tool`.")
    version = serializers.CharField(
        help_text="The current version, that plans are checked against."
    )
    placement = serializers.ChoiceField(
        choices=["fleet", "worker"],
        help_text="`fleet`: runs on the Celery workers; `worker`: on your organization's "
        "`orch worker`s, as a runner job.",
    )
    description = serializers.CharField()
    params_schema = serializers.JSONField(help_text="JSON Schema of the step's `params`.")
    output_schema = serializers.JSONField(help_text="JSON Schema of the step's output.")
    cost = serializers.JSONField(
        help_text='The cost rule on the fleet: {"credits": "0.02"}, {"computed": true}, or {} '
        "(the tool's price in settings)."
    )
    versions = serializers.SerializerMethodField()
    offered_by = serializers.SerializerMethodField(
        help_text="Who offers it now (empty: its steps wait with `no_worker_offers_tool`)."
    )

    @extend_schema_field(ToolVersionOutput(many=True))
    def get_versions(self, tool: PublishedTool) -> list[dict[str, Any]]:
        rows = catalogue.versions(tool)
        return list(ToolVersionOutput(rows, many=True).data)

    @extend_schema_field(OfferOutput(many=True))
    def get_offered_by(self, tool: PublishedTool) -> list[dict[str, Any]]:
        organization_id = self.context["organization_id"]
        return list(OfferOutput(catalogue.offers(tool, organization_id), many=True).data)


ToolPage = paginated(ToolOutput, "PaginatedToolList")


class ToolsApi(ApiView):
    queries = {"get": PageQuery}

    @extend_schema(
        tags=[TAG_TOOLS],
        operation_id="tools_list",
        summary="List the published tools you may use",
        parameters=[PageQuery],
        responses={200: ToolPage, **error_responses(*LIST_ERRORS)},
    )
    def get(self, request: Request) -> Response:
        """The fleet's tools and your workers' (written with the client's `@tool`), by
        name: each with its current version's schemas and cost rule, every version
        published, and who offers it now."""
        organization_id = organization_of(request).pk
        rows = catalogue.current_versions(organization_id)
        context = {"organization_id": organization_id}
        return page_response(
            request,
            rows,
            self.query,
            lambda page, many: ToolOutput(page, many=many, context=context),
        )


class ToolApi(ApiView):
    @extend_schema(
        tags=[TAG_TOOLS],
        operation_id="tools_retrieve",
        summary="Show a published tool",
        parameters=[
            OpenApiParameter(
                "name",
                str,
                OpenApiParameter.PATH,
                description="The tool's name, as steps write it.",
            )
        ],
        responses={200: ToolOutput, **error_responses(*LIST_ERRORS)},
    )
    def get(self, request: Request, name: str) -> Response:
        """One published tool, as the list shows it; 404 for a name neither the fleet
        nor your workers published."""
        organization_id = organization_of(request).pk
        found = catalogue.current_version(organization_id, name)
        if found is None:
            raise catalogue.ToolNotFound(f"tool {name} not found")
        return Response(ToolOutput(found, context={"organization_id": organization_id}).data)
