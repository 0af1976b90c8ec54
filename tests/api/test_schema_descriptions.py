"""The OpenAPI document's descriptions are written for the API's clients: every operation
has one, and none is a docstring that explains the code to its readers (ApiView's once
described five operations: api/schema.py, PublicAutoSchema)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from drf_spectacular.generators import SchemaGenerator

# What a description written for clients does not say: our module paths and files, the
# classes and settings the code is made of, and "we", which is the code's readers.
INTERNAL = re.compile(
    r"(?<![/\w])(?:api|runs|billing|orchestrator|common|config|artifacts|schedules|webhooks"
    r"|ratelimits)\.(?!md\b)[a-z_]+\b"
    r"|\.py\b|\bself\.|\b[Ww]e\b|\b[Oo]urs?\b|\bdocstring"
    r"|\b(?:ApiView|APIView|REST_FRAMEWORK|serializer|queryset|selector|getattr|to_representation)\b",
)


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    return dict(SchemaGenerator().get_schema(request=None, public=True))


def descriptions(node: Any, where: str = "") -> Iterator[tuple[str, str]]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "description" and isinstance(value, str):
                yield where, value
            else:
                yield from descriptions(value, f"{where}/{key}")
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from descriptions(value, f"{where}[{index}]")


def test_every_operation_has_a_description_of_its_own(document: dict[str, Any]) -> None:
    missing = [
        f"{method.upper()} {path}"
        for path, item in document["paths"].items()
        for method, operation in item.items()
        if not operation.get("description")
    ]
    texts = [
        operation["description"]
        for item in document["paths"].values()
        for operation in item.values()
    ]

    assert missing == []
    # A description shared by unrelated operations is a base class's, not theirs (the
    # runner's four reports share a sentence, each with its own before it).
    assert len(set(texts)) == len(texts)


def test_no_description_speaks_of_the_code(document: dict[str, Any]) -> None:
    internal = [(where, text) for where, text in descriptions(document) if INTERNAL.search(text)]

    assert internal == []


def test_the_check_would_see_the_docstring_that_once_leaked() -> None:
    from api.base import ApiView

    assert INTERNAL.search(ApiView.__doc__ or "")
