"""The OpenAPI document `/api/schema/` serves is valid OpenAPI 3.0.3, whatever routes the
URLconf holds: `openapi-spec-validator` checks it against the specification's own schema,
so a generator given it meets nothing the specification lacks. The plan's schemas come
from pydantic's JSON Schema (2020-12), which `api.schema` translates to 3.0; the
translation is checked here on models that use what the plan does not (yet)."""

from __future__ import annotations

import json
from typing import Any, Literal

import pytest
import yaml
from django.test import Client
from jsonschema import ValidationError
from openapi_schema_validator import OAS30Validator
from openapi_spec_validator import OpenAPIV30SpecValidator
from openapi_spec_validator.schemas import schema_v30
from openapi_spec_validator.schemas.backend.jsonschema import create_validator
from pydantic import BaseModel, Field

from api.schema import _openapi


class SpecValidator(OpenAPIV30SpecValidator):
    """The 3.0 validator on the pure-Python `jsonschema` backend: its errors carry their
    causes (which keyword of which schema is wrong); those of jsonschema-rs, which it
    picks when installed (schemathesis installs it), say only that a component is
    invalid."""

    schema_validator = create_validator(schema_v30)


def cause(error: ValidationError) -> str:
    """Where and what, from the deepest of an error's causes (the most specific one: a
    schema that matched none of `oneOf`'s choices failed each in its own way)."""
    while error.context:
        error = max(error.context, key=lambda inner: len(inner.absolute_path))
    return f"{'/'.join(map(str, error.absolute_path))}: {error.message}"


@pytest.fixture(scope="module")
def served() -> dict[str, Any]:
    """The document as served by default (YAML), read back."""
    response = Client().get("/api/schema/")
    assert response.status_code == 200
    document: dict[str, Any] = yaml.safe_load(response.content)
    return document


def test_the_served_document_is_valid_openapi_3_0(served: dict[str, Any]) -> None:
    assert served["openapi"] == "3.0.3"
    errors = list(SpecValidator(served).iter_errors())
    assert not errors, [cause(error) for error in errors]


def test_the_json_document_is_the_yaml_document(served: dict[str, Any]) -> None:
    response = Client().get("/api/schema/", {"format": "json"})
    assert response.status_code == 200
    assert json.loads(response.content) == served


# --------------------------------------------------------------------------- translation
class Inner(BaseModel):
    size: int = Field(gt=0)


class Outer(BaseModel):
    """Each field what pydantic writes in JSON Schema 2020-12 and 3.0 says otherwise."""

    inner: Inner | None = None  # anyOf [$ref, null]
    text: str | None = Field(default=None, max_length=5)  # anyOf [string, null]
    kind: Literal["only"] = "only"  # const
    word: str = Field(default="a", examples=["hello", "world"])  # examples
    either: int | str | None = None  # anyOf [integer, string, null]


def translated(model: type[BaseModel]) -> dict[str, dict[str, Any]]:
    """``model`` and its parts as OpenAPI 3.0 components, as ``api.schema`` makes the plan's."""
    schema = model.model_json_schema(ref_template="#/$defs/{model}", mode="validation")
    parts = {model.__name__: schema, **schema.pop("$defs", {})}
    names = {name: name for name in parts}
    return {name: _openapi(part, names) for name, part in parts.items()}


def test_json_schema_2020_12_is_translated_to_what_openapi_3_0_says() -> None:
    components = translated(Outer)
    properties = components["Outer"]["properties"]

    assert properties["inner"] == {
        "allOf": [{"$ref": "#/components/schemas/Inner"}],
        "nullable": True,
    }
    assert properties["text"] == {"type": "string", "maxLength": 5, "nullable": True}
    assert properties["kind"] == {"enum": ["only"], "type": "string", "default": "only"}
    assert properties["word"]["example"] == "hello"
    assert "examples" not in properties["word"]
    assert properties["either"] == {
        "anyOf": [{"type": "integer"}, {"type": "string"}],
        "nullable": True,
    }
    assert components["Inner"]["properties"]["size"] == {
        "type": "integer",
        "minimum": 0,
        "exclusiveMinimum": True,
    }


def test_translated_schemas_validate_as_openapi_3_0_does() -> None:
    components = translated(Outer)
    for schema in components.values():
        OAS30Validator.check_schema(schema)
    # openapi-schema-validator's 3.0 validator reads `nullable` on a `type` only (3.0.3's
    # wording), so the nullable reference is checked through its object alone.
    validator = OAS30Validator({"$ref": "#/components/schemas/Outer", "components": {
        "schemas": components}})  # fmt: skip
    assert validator.is_valid({"inner": {"size": 1}, "text": None, "kind": "only"})
    assert not validator.is_valid({"inner": {"size": 0}})
    assert not validator.is_valid({"text": "toolong"})
    assert not validator.is_valid({"kind": "other"})


def test_a_keyword_openapi_3_0_lacks_is_refused_by_name() -> None:
    class Pair(BaseModel):
        pair: tuple[int, str]  # prefixItems: 3.0 has no tuples

    with pytest.raises(ValueError, match="'prefixItems'"):
        translated(Pair)
