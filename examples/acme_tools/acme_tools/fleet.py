"""A tool for the fleet: pure Python, quick, nothing of your hosts needed. The Celery
workers load it from the package's entry point (``orchestrator.tools``)."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

from orchestrator_client.tools import tool

WORD = re.compile(r"[\w']+")


@dataclass
class WordStats:
    """How a text reads.

    Attributes:
        words: how many words it has.
        sentences: how many sentences.
        top: its most frequent words, most frequent first.
    """

    words: int
    sentences: int
    top: list[str] = field(default_factory=list)


@tool(name="acme.word_stats", version="1", cost="0.01")
def word_stats(text: str, top: int = 3) -> WordStats:
    """Count a text's words and sentences, and find its most frequent words.

    Args:
        text: the text to read.
        top: how many of the most frequent words to return.
    """
    words = [word.lower() for word in WORD.findall(text)]
    sentences = len([part for part in re.split(r"[.!?]+", text) if part.strip()])
    common = [word for word, _ in Counter(words).most_common(max(top, 0))]
    return WordStats(words=len(words), sentences=sentences, top=common)
