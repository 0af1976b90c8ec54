"""A tool for your own hosts: ``orch worker acme_tools.worker`` registers as a runner of
your organization offering it, and runs each step of it that the orchestrator hands over.
It reports its progress and stops when the step is cancelled."""

from __future__ import annotations

import re
from dataclasses import dataclass

from orchestrator_client.tools import Context, tool

SENTENCE = re.compile(r"(?<=[.!?])\s+")


@dataclass
class Summary:
    """A text's summary.

    Attributes:
        summary: its first sentences, within the word budget.
        sentences: how many sentences were kept.
    """

    summary: str
    sentences: int


@tool(name="acme.summarize", version="1", errors={TimeoutError: "timeout"})
def summarize(ctx: Context, text: str, max_words: int = 20, pause: float = 0.0) -> Summary:
    """Keep a text's first sentences, up to a word budget.

    Args:
        text: the text to summarize.
        max_words: at most this many words in the summary.
        pause: seconds to spend on each sentence (to watch progress and cancel it).
    """
    kept: list[str] = []
    used = 0
    sentences = [part for part in SENTENCE.split(text.strip()) if part]
    for number, sentence in enumerate(sentences, start=1):
        # Says how far it got, and raises Cancelled once the step is stopped.
        ctx.heartbeat({"sentence": number, "of": len(sentences)})
        ctx.sleep(pause)
        words = len(sentence.split())
        if used + words > max_words:
            break
        kept.append(sentence)
        used += words
    return Summary(summary=" ".join(kept), sentences=len(kept))
