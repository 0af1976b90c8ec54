"""Server-Sent Events, read as the WHATWG specification reads them (the subset a run's
event stream uses: ``id``, ``data``, comments; ``event`` and ``retry`` are read and
ignored).

    for message in messages(response.iter_lines()):
        print(message.id, message.data)
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class Message:
    """One dispatched event: its ``data`` (lines joined by newlines) and the last event
    id in force when it was dispatched (None before any)."""

    data: str
    id: str | None
    event: str = "message"


def messages(lines: Iterable[str]) -> Iterator[Message]:
    """The events in ``lines`` (the stream split at line ends, without them). A block
    without data dispatches nothing; a block cut off by the end of the stream is
    dropped, as a browser drops it."""
    data: list[str] = []
    event = ""
    last_id: str | None = None
    for line in lines:
        if not line:
            if data:
                yield Message("\n".join(data), last_id, event or "message")
            data, event = [], ""
            continue
        if line.startswith(":"):
            continue  # a comment: the server's keep-alive
        name, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if name == "data":
            data.append(value)
        elif name == "id" and "\0" not in value:
            last_id = value
        elif name == "event":
            event = value
