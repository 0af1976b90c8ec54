"""Reading a stranger's server, bounded: the one way a worker sends a request to a URL a
tenant gave and reads the answer (the `http` tool and a callback's request, a poll's
readings, the run webhooks, the on-call webhook). The `llm` tool and planner call the
operator's own LLM_BASE_URL, set in the environment and perhaps behind the
environment's proxy, which the guard's client ignores on purpose: they are not here.

A server chosen by a tenant may answer anything, as slowly as it likes. ``exchange``
and ``body`` bound what that can cost a worker:

- **Where.** Every connection, each redirect hop included, goes through the address
  guard (``orchestrator.netguard``), refusing what ``HTTP_TOOL_ALLOWED_NETWORKS`` does
  not allow.
- **How long.** One deadline (a ``time.monotonic()`` instant) covers the whole exchange:
  the name's look-up, connect, TLS, the request, the answer's headers and its body. A
  server that drips its headers a byte a second, each read succeeding, is cut at the
  deadline like a silent one (httpx's own timeouts bound each read alone).
- **How much.** The body is decoded as it is read, at most ``PIECE`` bytes of output at
  a time, and the cap counts the *decoded* bytes: a gzip bomb (a megabyte that inflates
  to a gigabyte) stops at the cap, having inflated little more than the cap in the
  worker. The encodings decoded are the ones asked for, gzip and deflate (and a stack of
  them); an answer in another (br, zstd...), whose decoders here cannot be held to a
  bound as they inflate, is ``Undecodable``.

What a caller does past the cap is its own: the `http` tool refuses the answer
(``TooLarge``: `invalid_output`), a poll and a webhook keep its first bytes (``cut``).
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import httpx
from django.conf import settings

from common.text import storable_text
from orchestrator.netguard import HTTP_TOOL, guarded_client

# Asked of every server: the encodings ``body`` decodes with a bound.
ACCEPT_ENCODING = "gzip, deflate"
# The most output one step of a decoder makes before the reader takes it.
PIECE = 64 * 1024


class TooLarge(Exception):
    """The decoded body passed ``limit`` bytes."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"response larger than {limit} bytes")
        self.limit = limit


class Undecodable(Exception):
    """The body's Content-Encoding is not one read here, or its data is corrupt."""


@contextmanager
def exchange(
    method: str,
    url: str,
    *,
    deadline: float,
    refused: str = HTTP_TOOL,
    networks: Sequence[str] | None = None,
    follow_redirects: bool = False,
    max_redirects: int = 0,
    **request: Any,
) -> Iterator[httpx.Response]:
    """One request whose answer's headers are in (its body not read yet: ``body``),
    everything before ``deadline``. ``networks``: the CIDRs the guard allows beyond the
    public ones (HTTP_TOOL_ALLOWED_NETWORKS when None); ``refused`` is what a refusal
    says may not happen. ``request``: httpx's keyword arguments (headers, params, json,
    content). Raises what httpx and the guard raise (``httpx.TimeoutException`` past the
    deadline, ``netguard.AddressNotAllowed``)."""
    left = max(deadline - time.monotonic(), 0.001)
    with (
        guarded_client(
            settings.HTTP_TOOL_ALLOWED_NETWORKS if networks is None else networks,
            refused=refused,
            deadline=deadline,
            timeout=left,
            follow_redirects=follow_redirects,
            max_redirects=max_redirects,
            headers={"Accept-Encoding": ACCEPT_ENCODING},
        ) as client,
        client.stream(method, url, **request) as response,
    ):
        yield response


def body(response: httpx.Response, limit: int, *, cut: bool = False) -> Iterator[bytes]:
    """The answer's body, decoded, in pieces of at most ``PIECE`` bytes, up to ``limit``
    bytes in all: past it ``TooLarge`` is raised, or with ``cut`` the rest is left
    unread. ``Undecodable`` for an encoding not read here or corrupt data."""
    pieces = response.iter_raw()
    for encoding in reversed(_encodings(response.headers.get("content-encoding", ""))):
        pieces = _inflated(pieces, encoding)
    total = 0
    for piece in pieces:
        if total + len(piece) > limit:
            if not cut:
                raise TooLarge(limit)
            if limit > total:
                yield piece[: limit - total]
            return
        total += len(piece)
        yield piece


def read(response: httpx.Response, limit: int, *, cut: bool = False) -> bytes:
    """``body`` whole, as bytes."""
    return b"".join(body(response, limit, cut=cut))


def text(response: httpx.Response, data: bytes) -> str:
    """``data`` as text in the answer's charset (UTF-8 when it names none or one not
    known); what does not decode becomes U+FFFD."""
    return data.decode(response.encoding or "utf-8", errors="replace")


def excerpt(response: httpx.Response, limit: int, chars: int = 200) -> str:
    """The first ``chars`` characters of the answer's text (of at most ``limit`` bytes
    read), as PostgreSQL can store them: what explains a failed webhook attempt. ""
    for an encoding not read here: the status is the answer, its text an aside."""
    try:
        data = read(response, limit, cut=True)
    except Undecodable:
        return ""
    return storable_text(text(response, data)[:chars])


def _encodings(header: str) -> list[str]:
    """The encodings applied, in the order applied (identity dropped), or Undecodable."""
    found = [item.strip().lower() for item in header.split(",") if item.strip()]
    found = [item for item in found if item != "identity"]
    for encoding in found:
        if encoding not in ("gzip", "x-gzip", "deflate"):
            raise Undecodable(
                f"the answer's Content-Encoding {encoding!r} is not one read here "
                f"(asked for: {ACCEPT_ENCODING})"
            )
    return found


def _inflated(pieces: Iterable[bytes], encoding: str) -> Iterator[bytes]:
    """``pieces`` inflated, at most PIECE bytes of output per step: the next step is
    taken only when the reader asks for more, so a bomb is never inflated past what is
    read. Data after the end of the compressed stream is ignored."""
    gzip = encoding in ("gzip", "x-gzip")
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS if gzip else zlib.MAX_WBITS)
    started = False
    for data in pieces:
        while True:
            try:
                out = inflater.decompress(data, PIECE)
            except zlib.error as exc:
                if gzip or started:
                    raise Undecodable(f"the answer's {encoding} data is corrupt: {exc}") from exc
                # "deflate" is zlib's format, but some servers send the raw stream.
                inflater = zlib.decompressobj(-zlib.MAX_WBITS)
                started = True
                continue
            started = True
            data = inflater.unconsumed_tail
            if out:
                yield out
            if inflater.eof:
                return
            if not data and len(out) < PIECE:
                break  # this input is all out: the next piece of it
