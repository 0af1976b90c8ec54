"""A tool for the fleet: pure Python, quick, nothing of your hosts needed. The Celery
workers load it from the package's entry point (``orchestrator.tools``). It reports its
progress (read with its step) and stops when the step is cancelled."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

from orchestrator_client.tools import Context, tool

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


# Version 2 took `pause`: a new parameter is a new version (docs/tools.md, "Versioning").
@tool(name="acme.word_stats", version="2", cost="0.01")
def word_stats(ctx: Context, text: str, top: int = 3, pause: float = 0.0) -> WordStats:
    """Count a text's words and sentences, and find its most frequent words.

    Args:
        text: the text to read.
        top: how many of the most frequent words to return.
        pause: seconds to spend on each sentence (to watch progress and cancel it).
    """
    parts = [part for part in re.split(r"[.!?]+", text) if part.strip()]
    for number in range(1, len(parts) + 1):
        # Kept with the step's next lease renewal; raises Cancelled once it is stopped.
        ctx.heartbeat({"sentence": number, "of": len(parts)})
        ctx.sleep(pause)
    words = [word.lower() for word in WORD.findall(text)]
    sentences = len(parts)
    common = [word for word, _ in Counter(words).most_common(max(top, 0))]
    return WordStats(words=len(words), sentences=sentences, top=common)
