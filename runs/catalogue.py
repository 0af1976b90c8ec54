"""The catalogue of published tools (docs/tools.md): what the fleet's packages and an
organization's ``orch worker``s declare with ``@tool``, each version with its JSON Schema.

- ``publish``: the fleet publishes its tools when a Celery worker starts
  (``orchestrator.tools.packages``), an organization's worker when it registers
  (``runs.waits.runners.register``). A version's schema is fixed once published: the same
  version again with another schema is refused (``ToolVersionConflict``), and a name the
  fleet offers cannot be an organization's (``ToolNameTaken``).
- ``OrganizationCatalogue``: what a plan of an organization may name (the fleet's tools
  and its own), read once per plan and only when it names a published tool; the current
  version of each, the newest first published.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import jsonschema
from django.conf import settings
from django.db import transaction
from django.db.models import Q, QuerySet
from django.utils import timezone

from billing.models import Organization
from common.tools.published import FLEET, WORKER, ToolSchema, is_published_name
from runs.models import PublishedTool, Runner, ToolPlacement

VERSION_MAX_LENGTH = 40
NAME_MAX_LENGTH = 64
DESCRIPTION_MAX_LENGTH = 10_000
# A schema larger than this (JSON text) is refused: it is read at every submission.
SCHEMA_MAX_BYTES = 64_000


class InvalidToolDefinition(Exception):
    """A published definition that cannot be kept (400 ``invalid_request``)."""

    code = "invalid_request"


class ToolNotFound(Exception):
    code = "not_found"


class ToolVersionConflict(Exception):
    """The version was published before with another schema (409)."""

    code = "tool_version_conflict"

    def __init__(self, name: str, version: str) -> None:
        super().__init__(
            f"{name} version {version} was published before with another schema or "
            "description: publish a new version"
        )
        self.details = {"name": name, "version": version}


class ToolNameTaken(Exception):
    """An organization's worker offers a tool the fleet offers (409)."""

    code = "tool_name_taken"

    def __init__(self, name: str) -> None:
        super().__init__(f"{name} is a tool of the fleet: a worker cannot offer it")
        self.details = {"name": name}


@dataclass(frozen=True)
class Definition:
    """One tool version as published (what the client's ``Tool.definition`` says)."""

    name: str
    version: str
    description: str
    params_schema: dict[str, Any]
    output_schema: dict[str, Any]
    cost: dict[str, Any]

    @property
    def digest(self) -> str:
        body = [self.description, self.params_schema, self.output_schema, self.cost]
        text = json.dumps(body, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()


def definition_from(data: Mapping[str, Any]) -> Definition:
    """A definition read and checked: its name dotted, its schemas valid JSON Schemas
    (the parameters' an object), its size bounded. ``InvalidToolDefinition`` otherwise."""
    name = data.get("name")
    if not isinstance(name, str) or not is_published_name(name) or len(name) > NAME_MAX_LENGTH:
        raise InvalidToolDefinition(
            f"tool name {name!r}: dotted and lower case, such as 'acme.summarize', at most "
            f"{NAME_MAX_LENGTH} characters"
        )
    version = data.get("version")
    if not isinstance(version, str) or not version or len(version) > VERSION_MAX_LENGTH:
        raise InvalidToolDefinition(f"{name}: version must be text of 1 to 40 characters")
    description = data.get("description") or ""
    if not isinstance(description, str) or len(description) > DESCRIPTION_MAX_LENGTH:
        raise InvalidToolDefinition(f"{name}: description must be text, at most 10000 characters")
    params_schema = data.get("params_schema")
    output_schema = data.get("output_schema", {})
    cost = data.get("cost") or {}
    for what, value in (("params_schema", params_schema), ("output_schema", output_schema)):
        if not isinstance(value, dict):
            raise InvalidToolDefinition(f"{name}: {what} must be a JSON Schema (an object)")
        try:
            jsonschema.Draft202012Validator.check_schema(value)
        except jsonschema.SchemaError as exc:
            raise InvalidToolDefinition(
                f"{name}: {what} is not a JSON Schema: {exc.message}"
            ) from None
    assert isinstance(params_schema, dict)  # checked above
    if params_schema.get("type") != "object":
        raise InvalidToolDefinition(f"{name}: params_schema must describe an object")
    if not isinstance(cost, dict):
        raise InvalidToolDefinition(f"{name}: cost must be an object")
    size = len(json.dumps([params_schema, output_schema]))
    if size > SCHEMA_MAX_BYTES:
        raise InvalidToolDefinition(f"{name}: its schemas take {size} bytes; at most 64000")
    return Definition(name, version, description, params_schema, output_schema, cost)


# --------------------------------------------------------------------------- publish
@transaction.atomic
def publish(
    *,
    organization: Organization | None,
    definitions: list[Definition],
    by: str,
    now: datetime | None = None,
) -> list[PublishedTool]:
    """Keep each definition: a new version is added (and becomes the current one), a
    version published before is confirmed, or refused if its schema changed. ``None``
    for the fleet; ``by`` is the fleet worker's hostname or the runner's id."""
    now = now or timezone.now()
    placement = ToolPlacement.FLEET if organization is None else ToolPlacement.WORKER
    if organization is not None:
        taken = PublishedTool.objects.filter(
            organization__isnull=True, name__in=[d.name for d in definitions]
        ).values_list("name", flat=True)
        for name in taken[:1]:
            raise ToolNameTaken(name)
    # Two workers publishing at once: each row is made once, then locked by both in turn.
    PublishedTool.objects.bulk_create(
        [
            PublishedTool(
                organization=organization,
                name=d.name,
                version=d.version,
                placement=placement,
                description=d.description,
                params_schema=d.params_schema,
                output_schema=d.output_schema,
                cost=d.cost,
                digest=d.digest,
                published_at=now,
                last_published_at=now,
            )
            for d in definitions
        ],
        ignore_conflicts=True,
    )
    kept = []
    for d in sorted(definitions, key=lambda d: (d.name, d.version)):
        row = _scope(organization).select_for_update().get(name=d.name, version=d.version)
        if row.digest != d.digest or row.placement != placement:
            raise ToolVersionConflict(d.name, d.version)
        row.last_published_at = now
        fields = ["last_published_at"]
        if organization is None:
            row.published_by = {**row.published_by, by: now.isoformat()}
            fields.append("published_by")
        row.save(update_fields=fields)
        kept.append(row)
    return kept


def _scope(organization: Organization | None) -> QuerySet[PublishedTool]:
    if organization is None:
        return PublishedTool.objects.filter(organization__isnull=True)
    return PublishedTool.objects.filter(organization=organization)


# --------------------------------------------------------------------------- reads
def visible(organization_id: Any) -> QuerySet[PublishedTool]:
    """Every version an organization may see: the fleet's and its own."""
    return PublishedTool.objects.filter(
        Q(organization__isnull=True) | Q(organization_id=organization_id)
    )


def current_versions(organization_id: Any) -> QuerySet[PublishedTool]:
    """One row per tool name, its current version (the newest first published; the
    fleet's when a name is both, which ``publish`` does not let happen anew)."""
    return (
        visible(organization_id)
        .order_by("name", "organization_id", "-published_at", "-id")
        .distinct("name")
    )


def current_version(organization_id: Any, name: str) -> PublishedTool | None:
    return current_versions(organization_id).filter(name=name).first()


def versions(tool: PublishedTool) -> QuerySet[PublishedTool]:
    """Every version of ``tool``'s name in its scope, the newest first."""
    return _scope(tool.organization).filter(name=tool.name).order_by("-published_at", "-id")


def offers(tool: PublishedTool, organization_id: Any) -> list[dict[str, Any]]:
    """Who offers ``tool``'s name now, any version: the fleet workers that published it at
    their start (the fleet keeps no liveness of its own: GET /healthz says which answer),
    or the organization's online runners (``orch worker``) that registered with it."""
    found = []
    if tool.placement == ToolPlacement.FLEET:
        for row in versions(tool):
            for hostname, since in sorted(row.published_by.items()):
                found.append(
                    {
                        "placement": FLEET,
                        "version": row.version,
                        "worker": hostname,
                        "hostname": hostname,
                        "tags": [],
                        "since": datetime.fromisoformat(since),
                    }
                )
        return found
    for runner in offering(organization_id, tool.name).order_by("hostname", "id"):
        found.append(
            {
                "placement": WORKER,
                "version": runner.tools[tool.name],
                "worker": runner.pk,
                "hostname": runner.hostname,
                "tags": runner.tags,
                "since": runner.registered_at,
            }
        )
    return found


def offering(organization_id: Any, name: str, now: datetime | None = None) -> QuerySet[Runner]:
    """The organization's online runners that offer the tool ``name`` (registered with
    it, not deregistered, heard from within ``RUNNER_STALE_AFTER``)."""
    now = now or timezone.now()
    return Runner.objects.filter(
        organization_id=organization_id,
        deregistered_at__isnull=True,
        last_heartbeat__gt=now - timedelta(seconds=settings.RUNNER_STALE_AFTER),
        tools__has_key=name,
    )


class OrganizationCatalogue:
    """``common.tools.published.Catalogue`` for one organization, read on first use."""

    def __init__(self, organization_id: Any) -> None:
        self.organization_id = organization_id
        self._tools: dict[str, ToolSchema] | None = None

    def _load(self) -> dict[str, ToolSchema]:
        if self._tools is None:
            rows = current_versions(self.organization_id).values_list(
                "name", "version", "placement", "params_schema"
            )
            self._tools = {
                name: ToolSchema(name, version, FLEET if placement == FLEET else WORKER, schema)
                for name, version, placement, schema in rows
            }
        return self._tools

    def get(self, name: str) -> ToolSchema | None:
        return self._load().get(name)

    def names(self) -> list[str]:
        return sorted(self._load())
