"""OpenAPI details drf-spectacular cannot infer: the plan's JSON schema, strict bodies.

The plan schema is built from the validator's own constants and the limits in settings,
so that it never refuses a plan the validator accepts (it is looser where JSON Schema
cannot say what ``runs.spec.parse_plan`` checks: dependency graphs, templates, total sizes).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from drf_spectacular.extensions import OpenApiSerializerFieldExtension
from drf_spectacular.plumbing import ResolvedComponent, list_hash
from rest_framework import serializers

from common.errors import RETRYABLE_CODES
from common.tools.registry import tool_names
from runs.models import FailureMode, Mode
from runs.plan import fields as spec
from runs.plan.model import BACKOFFS, FAILURE_MODES, MODES, Timeouts

NAME = {
    "type": "string",
    "pattern": "^[A-Za-z0-9][A-Za-z0-9_.-]*$",
    "maxLength": spec.NAME_MAX_LENGTH,
}
DURATION = {
    "description": "A duration such as `250ms`, `30s`, `5m`, `1.5h`, `7d`, or seconds.",
    "anyOf": [{"type": "string"}, {"type": "number", "exclusiveMinimum": True, "minimum": 0}],
}
DEPENDS_ON = {
    "type": "array",
    "items": {"type": "string"},
    "description": "Names of siblings this one waits for (the parent's mode must be `dag`).",
}


def _integer(low: int, high: int, description: str = "") -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "integer", "minimum": low, "maximum": high}
    return {**schema, "description": description} if description else schema


def _enum(values: tuple[str, ...] | frozenset[str]) -> dict[str, Any]:
    ordered = list(values) if isinstance(values, tuple) else sorted(values)
    return {"type": "string", "enum": ordered}


def _object(properties: dict[str, Any], required: list[str], description: str) -> dict[str, Any]:
    schema: dict[str, Any] = {
        "type": "object",
        "description": description,
        "properties": properties,
        "additionalProperties": False,
    }
    return {**schema, "required": required} if required else schema


def plan_components() -> dict[str, dict[str, Any]]:
    """The plan and its parts, as named schemas (names prefixed ``Plan``)."""
    limits = settings.ORCHESTRATOR_PLAN_LIMITS
    # The same choice sets as the outputs' `mode` and `failure_mode`: one enum component each.
    modes = {**_enum(MODES), "x-spec-enum-id": list_hash(Mode.choices)}
    failure_modes = {**_enum(FAILURE_MODES), "x-spec-enum-id": list_hash(FailureMode.choices)}
    retry = _object(
        {
            "max_attempts": _integer(1, limits["max_retry_attempts"]),
            "max_failures": _integer(1, limits["max_retry_attempts"]),
            "backoff": _enum(BACKOFFS),
            "base_delay_ms": _integer(0, 3_600_000),
            "max_delay_ms": _integer(0, 3_600_000),
            "multiplier": {"type": "number", "minimum": 1, "maximum": 10},
            "jitter": {"type": "number", "minimum": 0, "maximum": 1},
            "retry_on": {"type": "array", "items": _enum(RETRYABLE_CODES)},
        },
        [],
        "A step's retry policy; retry_on narrows the retryable error codes.",
    )
    handler_properties = {
        "name": NAME,
        "tool": _enum(tool_names()),
        "params": {"type": "object", "description": "The tool's parameters; `${...}` templates."},
        "when": {"type": "string", "description": "A condition; the step is skipped if false."},
        "retry": {"$ref": "#/components/schemas/PlanRetryPolicy"},
        "timeout": DURATION,
    }
    step = _object(
        {
            **handler_properties,
            "depends_on": DEPENDS_ON,
            "on_error": {
                "type": "array",
                "maxItems": limits["max_on_error"],
                "items": {"$ref": "#/components/schemas/PlanHandler"},
            },
        },
        ["name", "tool"],
        "One tool invocation.",
    )
    handler = _object(
        handler_properties, ["name", "tool"], "A step run when its step has failed for good."
    )
    task = _object(
        {
            "name": NAME,
            "mode": modes,
            "failure_mode": failure_modes,
            "max_concurrent_steps": _integer(1, 10_000),
            "depends_on": DEPENDS_ON,
            "timeout": DURATION,
            "steps": {
                "type": "array",
                "minItems": 1,
                "maxItems": limits["max_steps_per_task"],
                "items": {"$ref": "#/components/schemas/PlanStep"},
            },
        },
        ["name", "steps"],
        "A task: its steps run sequentially, in parallel or as a dag.",
    )
    agent = _object(
        {
            "name": NAME,
            "mode": modes,
            "failure_mode": failure_modes,
            "max_concurrent_tasks": _integer(1, 10_000),
            "depends_on": DEPENDS_ON,
            "timeout": DURATION,
            "tasks": {
                "type": "array",
                "minItems": 1,
                "maxItems": limits["max_tasks_per_agent"],
                "items": {"$ref": "#/components/schemas/PlanTask"},
            },
        },
        ["name", "tasks"],
        "An agent: its tasks run sequentially, in parallel or as a dag.",
    )
    plan = _object(
        {
            "name": {"type": "string", "minLength": 1, "maxLength": spec.RUN_NAME_MAX_LENGTH},
            "priority": _integer(0, 9, "0 runs first; FIFO within a priority."),
            "failure_mode": failure_modes,
            "mode": modes,
            "max_attempts": _integer(1, 10, "Run-level attempts (retry after failure)."),
            "credits": {
                "description": "Credits to reserve; estimated from the plan when omitted.",
                "anyOf": [
                    {"type": "string"},
                    {
                        "type": "number",
                        "minimum": 0,
                        "exclusiveMinimum": True,
                        "maximum": float(spec.MAX_CREDITS),
                        "exclusiveMaximum": True,
                    },
                ],
            },
            "variables": {"type": "object", "description": "Read by `${variables.<name>}`."},
            "timeouts": _object(
                dict.fromkeys(Timeouts.model_fields, DURATION), [], "Timeouts by level and state."
            ),
            "max_agents": _integer(1, limits["max_agents"]),
            "agents": {
                "type": "array",
                "minItems": 1,
                "maxItems": limits["max_agents"],
                "items": {"$ref": "#/components/schemas/PlanAgent"},
            },
        },
        ["name", "agents"],
        "A run's plan: agents, their tasks and the tasks' steps. Every problem is reported "
        "at once, with its path, as `invalid_plan`.",
    )
    return {
        "Plan": plan,
        "PlanAgent": agent,
        "PlanTask": task,
        "PlanStep": step,
        "PlanHandler": handler,
        "PlanRetryPolicy": retry,
    }


class PlanField(serializers.JSONField):
    """A run's plan: any JSON here; ``runs.spec.parse_plan`` validates it (in the service)."""


class PlanFieldExtension(OpenApiSerializerFieldExtension):  # type: ignore[no-untyped-call]
    target_class = PlanField

    def map_serializer_field(self, auto_schema: Any, direction: Any) -> dict[str, Any]:
        for name, schema in plan_components().items():
            component = ResolvedComponent(  # type: ignore[no-untyped-call]
                name=name, type=ResolvedComponent.SCHEMA, object=name, schema=schema
            )
            auto_schema.registry.register_on_missing(component)
        return {"$ref": "#/components/schemas/Plan"}


def strict_request_bodies(result: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    """Postprocessing hook: request bodies refuse unknown fields (``InputSerializer``),
    so their schemas say ``additionalProperties: false``."""
    for name, schema in result.get("components", {}).get("schemas", {}).items():
        if name.endswith("Request") and schema.get("type") == "object":
            schema["additionalProperties"] = False
    return result
