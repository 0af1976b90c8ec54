"""Reading a run's event stream in tests, strictly: every block must be the keep-alive
comment or exactly ``id: N`` then ``data: <JSON>`` (no ``event:`` field, nothing else)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import redis

KEEPALIVE = ": keepalive"


@dataclass(frozen=True)
class Block:
    """One block of the stream: an event (``id`` and ``data``), or the keep-alive."""

    id: int | None
    data: Any

    @property
    def keepalive(self) -> bool:
        return self.id is None


def blocks(lines: Iterable[str]) -> Iterator[Block]:
    pending: list[str] = []
    for line in lines:
        if line:
            pending.append(line)
            continue
        if not pending:
            continue
        if pending == [KEEPALIVE]:
            yield Block(None, None)
        else:
            assert len(pending) == 2, pending
            assert pending[0].startswith("id: "), pending
            assert pending[1].startswith("data: "), pending
            block = Block(int(pending[0][4:]), json.loads(pending[1][6:]))
            assert block.data["id"] == block.id, pending
            yield block
        pending = []
    assert not pending, f"the stream ended inside a block: {pending}"


def subscribers(broker: redis.Redis[bytes], channel: str) -> int:
    """How many connections listen on ``channel`` (each open stream of its run is one)."""
    counts = dict(broker.pubsub_numsub(channel))
    return int(counts.get(channel, 0) or counts.get(channel.encode(), 0))  # type: ignore[call-overload]


def stream_url(base: str, run_id: object) -> str:
    return f"{base}/api/v1/runs/{run_id}/events/stream"


def open_stream(
    http: httpx.Client,
    base: str,
    run_id: object,
    key: str,
    *,
    params: dict[str, str] | None = None,
    headers: dict[str, str] | None = None,
) -> Any:
    """``http.stream(...)`` of the run's event stream (a context manager)."""
    return http.stream(
        "GET",
        stream_url(base, run_id),
        params=params,
        headers={
            "Authorization": f"Bearer {key}",
            "Accept": "text/event-stream",
            **(headers or {}),
        },
    )


def read_all(
    base: str,
    run_id: object,
    key: str,
    *,
    params: dict[str, str] | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = 60,
) -> list[dict[str, Any]]:
    """Every event of a stream that ends by itself (the run ends), in order."""
    with (
        httpx.Client(timeout=timeout) as http,
        open_stream(http, base, run_id, key, params=params, headers=headers) as response,
    ):
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"] == "text/event-stream"
        return [block.data for block in blocks(response.iter_lines()) if not block.keepalive]
