"""Small callables for the `python` tool, allow-listed by default for demos and tests."""

from __future__ import annotations


def add(a: float, b: float) -> float:
    return a + b


def word_count(text: str) -> dict[str, int]:
    return {"words": len(text.split()), "characters": len(text)}
