"""The client's hand-written types (`orchestrator_client/types.py`) and the OpenAPI document
`/api/schema/` serves agree, field by field.

The mapping: each TypedDict describes one component of the document (`COMPONENTS`), and
`Page` describes every page component (`Paginated<Item>List`, `CursorPaginated<Item>List`),
its `Item` being the TypedDict of the page's results. For each pair:

- every key the TypedDict declares is a property of the component: nothing invented;
- every property the component requires is declared: nothing the server always sends is
  missing; a key the TypedDict requires is one the component requires, so a client may
  read it without `.get` (a `NotRequired` key may be a required property; `Page`, which
  describes both kinds of page, declares `count` NotRequired: cursor pages lack it);
- their values agree: null where the component says `nullable`, and only there; `str` for
  a string of any format (ids, dates and credits are strings), `int` for an integer,
  `float` for a number, `bool`, `list[X]` for an array of X, `dict[str, X]` for an object
  of X values, the mapped TypedDict for a reference to a component, `str` or exactly the
  enum's values as a `Literal` for an enum, and `Any` for anything. A property with no
  type in the document (free-form JSON: outputs, payloads, `last_error`) takes whatever
  type the client finds useful (`ErrorInfo`, `dict[str, Any]`).

Every TypedDict of the module is mapped, or named in `NOT_COMPONENTS` with the reason, so
a new type cannot skip the check.
"""

from __future__ import annotations

import json
import re
from types import NoneType, UnionType
from typing import (
    Any,
    Literal,
    NotRequired,
    Required,
    TypedDict,
    TypeVar,
    Union,
    get_args,
    get_origin,
    get_type_hints,
    is_typeddict,
)

import pytest
from django.test import Client

from orchestrator_client import types

Schemas = dict[str, dict[str, Any]]

COMPONENTS: dict[Any, str] = {
    types.Credits: "CreditsOutput",
    types.Run: "RunOutput",
    types.Counts: "CountsOutput",
    types.Progress: "ProgressOutput",
    types.ChildRun: "ChildRunOutput",
    types.RunDetail: "RunDetailOutput",
    types.Decision: "ApprovalOutput",
    types.ForkPreview: "ForkPreviewOutput",
    types.Agent: "AgentOutput",
    types.Task: "TaskOutput",
    types.Step: "StepOutput",
    types.Event: "EventOutput",
    types.Balance: "BalanceOutput",
    types.LedgerEntry: "LedgerEntryOutput",
    types.Limits: "LimitsOutput",
    types.Usage: "UsageOutput",
    types.Quota: "QuotaOutput",
    types.Quotas: "QuotasOutput",
    types.Organization: "OrganizationOutput",
    types.Secret: "SecretOutput",
    types.RateLimit: "RateLimitOutput",
    types.Runner: "RunnerOutput",
    types.RunnerJob: "JobOutput",
    types.PublishedTool: "ToolOutput",
    types.ToolVersion: "ToolVersionOutput",
    types.ToolOffer: "OfferOutput",
    types.Artifact: "ArtifactOutput",
    types.UploadTarget: "UploadTargetOutput",
    types.UploadStarted: "StartUploadOutput",
    types.EscalationError: "EscalationErrorOutput",
    types.Escalation: "EscalationOutput",
    types.RunRef: "RunRefOutput",
    types.Schedule: "ScheduleOutput",
    types.ScheduleDetail: "ScheduleDetailOutput",
    types.ScheduleFire: "FireOutput",
    types.Webhook: "WebhookEndpointOutput",
    types.WebhookCreated: "WebhookEndpointCreatedOutput",
    types.WebhookAttempt: "WebhookAttemptOutput",
    types.WebhookDelivery: "WebhookDeliveryOutput",
}
TYPES = {component: client_type for client_type, component in COMPONENTS.items()}
NOT_COMPONENTS: dict[Any, str] = {
    types.Page: "generic: checked against every page component",
    types.ErrorInfo: "a run's `last_error`, free-form JSON in the document ({code, message})",
}
PAGES = re.compile(r"(Cursor)?Paginated\w+List")
SIMPLE = {"string": str, "integer": int, "number": float, "boolean": bool}
# The keywords that give a value a shape; a schema with none of them is free-form JSON.
SHAPES = frozenset({"type", "$ref", "enum", "items", "properties", "allOf", "anyOf", "oneOf"})


@pytest.fixture(scope="module")
def schemas() -> Schemas:
    response = Client().get("/api/schema/", {"format": "json"})
    assert response.status_code == 200
    found: Schemas = json.loads(response.content)["components"]["schemas"]
    return found


def test_every_type_of_the_client_is_mapped_to_the_document() -> None:
    declared = [
        value
        for value in vars(types).values()
        if is_typeddict(value) and value.__module__ == types.__name__
    ]
    assert declared
    assert not [t.__name__ for t in declared if t not in COMPONENTS and t not in NOT_COMPONENTS]


@pytest.mark.parametrize("client_type", list(COMPONENTS), ids=lambda t: t.__name__)
def test_each_type_agrees_with_its_component(client_type: Any, schemas: Schemas) -> None:
    assert not disagreements(client_type, COMPONENTS[client_type], schemas, {})


def test_a_page_agrees_with_every_page_component(schemas: Schemas) -> None:
    pages = sorted(name for name in schemas if PAGES.fullmatch(name))
    assert "PaginatedRunList" in pages
    assert "CursorPaginatedEventList" in pages
    found = []
    for page in pages:
        items = reference(schemas[page]["properties"]["results"]["items"])
        if items not in TYPES:
            found.append(f"{page}: no client type for its results, {items}")
            continue
        found += disagreements(types.Page, page, schemas, {types.Item: TYPES[items]}, some=True)
    declared = get_type_hints(types.Page).keys()
    found += [
        f"Page.{key}: in no page component"
        for key in declared
        if not any(key in schemas[page]["properties"] for page in pages)
    ]
    assert not found


# --------------------------------------------------------------------------- the walk
def disagreements(
    client_type: Any,
    component: str,
    schemas: Schemas,
    bound: dict[Any, Any],
    *,
    some: bool = False,
) -> list[str]:
    """Where ``client_type`` and the component ``component`` disagree; ``bound`` gives
    the client type's type variables their types. ``some``: the type describes several
    components, so a NotRequired key may be missing from this one."""
    schema = schemas[component]
    properties: dict[str, Any] = schema.get("properties", {})
    required = set(schema.get("required", []))
    # With include_extras, NotRequired survives: Python 3.11 computes
    # __required_keys__ wrongly for string annotations (`from __future__ import
    # annotations`), so the annotations are read instead.
    hints = get_type_hints(client_type, include_extras=True)
    found = []
    for key, hint in hints.items():
        where = f"{client_type.__name__}.{key} ({component})"
        optional = get_origin(hint) is NotRequired or (
            not client_type.__total__ and get_origin(hint) is not Required
        )
        if get_origin(hint) in (NotRequired, Required):
            (hint,) = get_args(hint)
        if key not in properties:
            if not (some and optional):
                found.append(f"{where}: not in the document")
            continue
        if not optional and key not in required:
            found.append(f"{where}: the client requires it, the document does not")
        found += value_disagreements(where, hint, properties[key], schemas, bound)
    found += [
        f"{client_type.__name__} lacks {key}, which {component} requires"
        for key in sorted(required - hints.keys())
    ]
    return found


def value_disagreements(
    where: str, hint: Any, schema: dict[str, Any], schemas: Schemas, bound: dict[Any, Any]
) -> list[str]:
    if isinstance(hint, TypeVar):
        hint = bound[hint]
    if hint is Any:
        return []
    schema, nullable = unwrapped(schema, schemas)
    members = list(get_args(hint)) if get_origin(hint) in (Union, UnionType) else [hint]
    client_null = NoneType in members
    members = [member for member in members if member is not NoneType]
    found = []
    if client_null != nullable:
        says = "may be null" if nullable else "is never null"
        found.append(f"{where}: the document says it {says}, the client type is {hint}")
    if len(members) != 1:
        return [*found, f"{where}: {hint} is a union the document does not declare"]
    (hint,) = members
    if free_form(schema):
        return found
    if "$ref" in schema:
        name = reference(schema)
        if "enum" in schemas[name]:
            return found + enum_disagreements(where, hint, schemas[name]["enum"])
        if hint is not TYPES.get(name):
            return [*found, f"{where}: {name} is not described by {hint}"]
        return found
    if "enum" in schema:
        return found + enum_disagreements(where, hint, schema["enum"])
    kind = schema.get("type")
    if kind in SIMPLE:
        if hint is not SIMPLE[kind]:
            found.append(f"{where}: {kind} is not described by {hint}")
        return found
    origin, args = get_origin(hint), get_args(hint)
    if kind == "array" and origin is list:
        return found + value_disagreements(f"{where}[]", args[0], schema["items"], schemas, bound)
    if kind == "object" and origin is dict and args[0] is str:
        values = schema.get("additionalProperties", True)
        if values is True:  # any value: a free-form schema below says the same
            values = {}
        return found + value_disagreements(f"{where}{{}}", args[1], values, schemas, bound)
    return [*found, f"{where}: {schema} is not described by {hint}"]


def unwrapped(schema: dict[str, Any], schemas: Schemas) -> tuple[dict[str, Any], bool]:
    """The schema itself and whether it admits null. drf-spectacular writes a reference
    with siblings as `allOf: [{$ref}]`, and a nullable enum as `oneOf` with `NullEnum`."""
    nullable = schema.get("nullable") is True
    for key in ("allOf", "oneOf", "anyOf"):
        branches = schema.get(key)
        if not branches:
            continue
        rest = [b for b in branches if "$ref" not in b or schemas[reference(b)] != {"enum": [None]}]
        nullable = nullable or len(rest) < len(branches)
        if len(rest) == 1:
            return rest[0], nullable
    return schema, nullable


def free_form(schema: dict[str, Any]) -> bool:
    """Any JSON at all: the schema constrains nothing a type could say."""
    return not schema.keys() & SHAPES


def enum_disagreements(where: str, hint: Any, values: list[Any]) -> list[str]:
    values = [value for value in values if value is not None]
    if hint is str and all(isinstance(value, str) for value in values):
        return []
    if get_origin(hint) is Literal and set(get_args(hint)) == set(values):
        return []
    return [f"{where}: the document's values are {sorted(values)}, the client's {hint}"]


def reference(schema: dict[str, Any]) -> str:
    ref: str = schema["$ref"]
    return ref.removeprefix("#/components/schemas/")


class Thing(TypedDict):
    name: str
    size: int | None
    tags: list[int]
    state: Literal["a", "b"]
    invented: str


def test_the_walk_finds_each_kind_of_disagreement() -> None:
    # The walk itself, on a made-up component: a check that could never fail would
    # prove nothing about the types above.
    component = {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "size": {"type": "integer"},
            "tags": {"type": "array", "items": {"type": "string"}},
            "state": {"$ref": "#/components/schemas/StateEnum"},
            "missing": {"type": "string"},
        },
        "required": ["size", "tags", "state", "missing"],
    }
    schemas: Schemas = {"Thing": component, "StateEnum": {"enum": ["a", "c"], "type": "string"}}

    found = disagreements(Thing, "Thing", schemas, {})

    assert found == [
        "Thing.name (Thing): the client requires it, the document does not",
        f"Thing.size (Thing): the document says it is never null, the client type is {int | None}",
        f"Thing.tags (Thing)[]: string is not described by {int}",
        "Thing.state (Thing): the document's values are ['a', 'c'], the client's "
        f"{Literal['a', 'b']}",
        "Thing.invented (Thing): not in the document",
        "Thing lacks missing, which Thing requires",
    ]
