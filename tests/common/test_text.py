"""Text PostgreSQL can store: what is refused, what is replaced, where it was found."""

from __future__ import annotations

from typing import Any

import pytest

from common.text import REPLACEMENT, storable_text, text_problem, unstorable_string


@pytest.mark.parametrize("text", ["", "plain", "é ✓ 🙂", "tab\tand\nnewline", "\\u0000"])
def test_storable_text_is_returned_as_it_is(text: str) -> None:
    assert text_problem(text) is None
    assert storable_text(text) is text


@pytest.mark.parametrize(
    ("text", "problem", "stored"),
    [
        ("a\x00b", "contains a NUL character", f"a{REPLACEMENT}b"),
        ("\x00\x00", "contains a NUL character", REPLACEMENT * 2),
        ("lone \ud800 high", "contains an unpaired surrogate", f"lone {REPLACEMENT} high"),
        ("lone \udfff low", "contains an unpaired surrogate", f"lone {REPLACEMENT} low"),
        ("both \x00 \udc80 🙂", "contains a NUL character", f"both {REPLACEMENT} {REPLACEMENT} 🙂"),
    ],
)
def test_unstorable_characters_are_named_and_replaced(text: str, problem: str, stored: str) -> None:
    assert text_problem(text) == problem
    assert storable_text(text) == stored
    assert text_problem(storable_text(text)) is None


@pytest.mark.parametrize(
    ("value", "found"),
    [
        ({"a": [1, "x", {"b": "fine"}]}, None),
        (None, None),
        ({"body": ["ok", "bad\x00"]}, "$.body[1]: contains a NUL character"),
        ({"outer": {"k\ud800": 1}}, "$.outer: a key contains an unpaired surrogate"),
        ("\x00", "$: contains a NUL character"),
        ((1, "\udc00"), "$[1]: contains an unpaired surrogate"),
    ],
)
def test_unstorable_string_gives_the_path_of_the_first_problem(
    value: Any, found: str | None
) -> None:
    assert unstorable_string(value) == found


def test_unstorable_string_walks_deep_values_without_recursion() -> None:
    value: Any = "\x00"
    for _ in range(5000):
        value = [value]
    found = unstorable_string(value)
    assert found is not None
    assert found.endswith("[0]: contains a NUL character")
