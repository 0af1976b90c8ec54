"""OpenAPI details drf-spectacular cannot infer: the plan's schema, strict bodies.

The plan's schema is generated from the model that validates it (``runs.plan.Plan``,
declared in ``runs.plan.model``), so the two cannot drift: it never refuses a plan
``parse_plan`` accepts, and refuses every plan whose fields are of the wrong type, out
of range, unknown or missing (tests/api/test_plan_schema.py holds them to it). It is
looser only where JSON Schema cannot say what the whole-plan checks do: dependency
graphs, templates, names, total sizes.

The document is OpenAPI 3.0.3 (docs/api.md says why): pydantic writes JSON Schema 2020-12,
so ``_openapi`` translates what has a 3.0 equivalent and refuses what has none, and
tests/api/test_openapi_document.py validates the whole document served.

Its descriptions are what was written for clients (``PublicAutoSchema``), never a
docstring that documents the code.
"""

from __future__ import annotations

import inspect
from typing import Any

from drf_spectacular.drainage import get_override
from drf_spectacular.extensions import OpenApiSerializerFieldExtension
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.plumbing import ResolvedComponent, list_hash
from rest_framework import serializers

from runs.models import FailureMode, Mode
from runs.plan import Plan

# Keywords whose values are schemas (the rest are copied as they are).
_SUBSCHEMA_LISTS = ("anyOf", "allOf", "oneOf")
_SUBSCHEMAS = ("items", "additionalProperties", "not")
# OpenAPI 3.0's Schema Object, whole: anything else (`prefixItems`, `$defs` below the
# root, `if`, `patternProperties`, ...) has no 3.0 equivalent, and a document carrying it
# is refused by validators and misread by generators.
_OPENAPI_30_KEYWORDS = frozenset(
    {
        "$ref", "title", "description", "default", "example", "deprecated", "readOnly",
        "writeOnly", "nullable", "discriminator", "xml", "externalDocs", "type", "format",
        "enum", "multipleOf", "maximum", "exclusiveMaximum", "minimum", "exclusiveMinimum",
        "maxLength", "minLength", "pattern", "maxItems", "minItems", "uniqueItems",
        "maxProperties", "minProperties", "required", "properties", "additionalProperties",
        "items", "allOf", "anyOf", "oneOf", "not",
    }
)  # fmt: skip
_NULL = {"type": "null"}
# The plan's enums that are the same choice sets as the outputs' `mode` and
# `failure_mode`: marked as such, drf-spectacular makes one enum component of each.
_ENUM_IDS = {tuple(choices.values): list_hash(choices.choices) for choices in (Mode, FailureMode)}


def plan_components() -> dict[str, dict[str, Any]]:
    """The plan and its parts as OpenAPI 3.0 schemas: ``Plan``, and each part named
    ``Plan<Part>`` (the model ``AgentPlan`` is ``PlanAgent``)."""
    schema = Plan.model_json_schema(ref_template="#/$defs/{model}", mode="validation")
    parts: dict[str, Any] = {"Plan": schema, **schema.pop("$defs", {})}
    names = {name: _component_name(name) for name in parts}
    components = {names[name]: _openapi(part, names) for name, part in parts.items()}
    hoisted: dict[str, dict[str, Any]] = {}
    components = {name: _hoisted(part, hoisted) for name, part in components.items()}
    return {**components, **hoisted}


def _hoisted(schema: Any, found: dict[str, dict[str, Any]]) -> Any:
    """``schema`` with each part marked ``x-component`` (a choice set inside an
    ``anyOf``, which drf-spectacular's enum pass does not reach) made a component of that
    name and referred to: the name generated clients know it by."""
    if isinstance(schema, list):
        return [_hoisted(part, found) for part in schema]
    if not isinstance(schema, dict):
        return schema
    if "x-component" in schema:
        part = {key: value for key, value in schema.items() if key != "x-component"}
        found[schema["x-component"]] = part
        return {"$ref": f"#/components/schemas/{schema['x-component']}"}
    return {key: _hoisted(value, found) for key, value in schema.items()}


def _component_name(model: str) -> str:
    return model if model == "Plan" else f"Plan{model.removesuffix('Plan')}"


def _openapi(schema: dict[str, Any], names: dict[str, str]) -> dict[str, Any]:
    """A JSON Schema (2020-12, as pydantic writes it) in OpenAPI 3.0's dialect.

    Raises ``ValueError`` for a keyword 3.0 cannot express, naming it: the model should
    say it differently, or this function learn its translation."""
    schema = _without_null(schema)
    result: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "title" or (
            key == "default" and (value in (None, "", [], {}) or "$ref" in schema)
        ):
            # pydantic's titles repeat the names, an empty default says nothing (and ""
            # is no condition a client may write), a $ref's siblings are ignored in 3.0.
            continue
        if key == "$ref":
            result[key] = f"#/components/schemas/{names[value.rsplit('/', 1)[-1]]}"
        elif key in ("exclusiveMinimum", "exclusiveMaximum"):
            result["minimum" if key == "exclusiveMinimum" else "maximum"] = value
            result[key] = True
        elif key == "properties":
            result[key] = {name: _openapi(part, names) for name, part in value.items()}
        elif key in _SUBSCHEMA_LISTS:
            result[key] = [_openapi(part, names) for part in value]
        elif key in _SUBSCHEMAS and isinstance(value, dict):
            result[key] = _openapi(value, names)
        elif key == "const":
            result["enum"] = [value]
        elif key == "examples":
            result["example"] = value[0]
        elif key in _OPENAPI_30_KEYWORDS or key.startswith("x-"):
            result[key] = value
        else:
            raise ValueError(f"the plan's JSON Schema uses {key!r}, which OpenAPI 3.0 lacks")
    enum_id = _ENUM_IDS.get(tuple(result.get("enum", ())))
    if enum_id:
        result["x-spec-enum-id"] = enum_id
    return result


def _without_null(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with JSON Schema's null type (``X | None`` is ``anyOf: [X, {type:
    null}]``) said as 3.0 says it: ``nullable: true``. 3.0 ignores the siblings of a
    ``$ref``, so a nullable reference is ``allOf: [{$ref}]`` beside it, as drf-spectacular
    writes its own nullable references and as generators read them (``X | None``)."""
    for key in ("anyOf", "oneOf"):
        branches = schema.get(key)
        if not isinstance(branches, list) or _NULL not in branches:
            continue
        rest = [branch for branch in branches if branch != _NULL]
        schema = {k: v for k, v in schema.items() if k != key}
        if len(rest) != 1:
            schema[key] = rest
        elif "$ref" in rest[0]:
            schema["allOf"] = rest
        else:
            schema = {**rest[0], **schema}
        return {**schema, "nullable": True}
    if isinstance(schema.get("type"), list) and "null" in schema["type"]:
        types = [kind for kind in schema["type"] if kind != "null"]
        if len(types) != 1:
            raise ValueError(f"OpenAPI 3.0 has no type that is one of {types}")
        return {**schema, "type": types[0], "nullable": True}
    return schema


class PlanField(serializers.JSONField):
    """A run's plan: any JSON here; ``runs.plan.parse_plan`` validates it (in the service)."""


class PlanFieldExtension(OpenApiSerializerFieldExtension):  # type: ignore[no-untyped-call]
    target_class = PlanField

    def map_serializer_field(self, auto_schema: Any, direction: Any) -> dict[str, Any]:
        for name, schema in plan_components().items():
            component = ResolvedComponent(  # type: ignore[no-untyped-call]
                name=name, type=ResolvedComponent.SCHEMA, object=name, schema=schema
            )
            auto_schema.registry.register_on_missing(component)
        return {"$ref": "#/components/schemas/Plan"}


class PublicAutoSchema(AutoSchema):
    """An operation's description is its ``extend_schema(description=...)`` or its method's
    own docstring; a component's, its serializer class's own docstring. drf-spectacular
    would otherwise fall back on the docstrings of base classes, which explain the code to
    its readers: ``ApiView``'s described five operations, ``FastOutput``'s two outputs
    (tests/api/test_schema_descriptions.py)."""

    def get_description(self) -> str:  # type: ignore[override]
        action = getattr(self.view, "action", None) or (self.method or "").lower()
        return own_doc(getattr(self.view, action, None))

    def _map_basic_serializer(self, serializer: Any, direction: Any) -> dict[str, Any]:
        schema: dict[str, Any] = super()._map_basic_serializer(serializer, direction)  # type: ignore[no-untyped-call]
        description = get_override(serializer, "description", own_doc(type(serializer)))
        if description:
            schema["description"] = description
        else:
            schema.pop("description", None)
        return schema


def own_doc(thing: Any) -> str:
    """The docstring ``thing`` was written with, not one inherited from a base class."""
    doc = (
        thing.__dict__.get("__doc__")
        if isinstance(thing, type)
        else getattr(thing, "__doc__", None)
    )
    if not doc:
        return ""
    return "\n".join(line.rstrip() for line in inspect.cleandoc(doc).splitlines())


def strict_request_bodies(result: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    """Postprocessing hook: request bodies refuse unknown fields (``InputSerializer``),
    so their schemas say ``additionalProperties: false``."""
    for name, schema in result.get("components", {}).get("schemas", {}).items():
        if name.endswith("Request") and schema.get("type") == "object":
            schema["additionalProperties"] = False
    return result
