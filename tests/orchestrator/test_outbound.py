"""The bounds of reading a stranger's server (orchestrator/outbound.py), through the `http`
tool against servers on 127.0.0.1 that answer a gzip bomb, encodings, or drip their
headers. The same bounds for poll readings: tests/orchestrator/test_polling.py; for run
webhooks: tests/webhooks/test_sending.py; for on-call: tests/orchestrator/test_notify.py.
"""

from __future__ import annotations

import gzip
import time
import zlib
from typing import Any

import pytest
from pytest_django.fixtures import Settings

from common.tools.base import ToolContext, ToolError
from orchestrator import outbound
from orchestrator.tools.builtin import http
from tests.http_fixture import (
    MEMORY_BOUND,
    DrippingReceiver,
    HttpServer,
    gzip_bomb,
    peak_memory,
)

# What a timed exchange may overrun its deadline by, on a busy 2-core machine.
MARGIN_S = 1.5
TEXT = b"a line of text that repeats\n" * 20_000  # 560 kB: many pieces of the decoder


def context(timeout_s: float | None = None) -> ToolContext:
    run_id = "00000000-0000-0000-0000-000000000001"
    return ToolContext(step_id=1, run_id=run_id, attempt=1, timeout_s=timeout_s)


def failure(params: dict[str, Any], ctx: ToolContext | None = None) -> ToolError:
    with pytest.raises(ToolError) as caught:
        http(params, ctx or context())
    return caught.value


def raw_deflate(data: bytes) -> bytes:
    packer = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    return packer.compress(data) + packer.flush()


@pytest.mark.parametrize("stacked", [False, True])
def test_http_refuses_a_gzip_bomb_at_its_cap_having_inflated_little_of_it(
    http_server: HttpServer, stacked: bool
) -> None:
    # 256 MiB of zeros in 255 KiB; gzipped again, in a few KiB.
    bomb = gzip.compress(gzip_bomb()) if stacked else gzip_bomb()
    encoding = "gzip, gzip" if stacked else "gzip"
    http_server.respond("/bomb", body=bomb, headers={"Content-Encoding": encoding})

    with peak_memory() as peak:
        error = failure({"url": f"{http_server.url}/bomb"})

    assert (error.code, error.retryable) == ("invalid_output", False)
    assert error.message == "response larger than 1000000 bytes"
    assert peak() < MEMORY_BOUND  # inflated piece by piece, not a chunk at once


@pytest.mark.parametrize(
    ("encoding", "packed"),
    [
        ("gzip", gzip.compress(TEXT)),
        ("deflate", zlib.compress(TEXT)),
        ("deflate", raw_deflate(TEXT)),  # what some servers send for deflate
        ("gzip, deflate", zlib.compress(gzip.compress(TEXT))),
        ("identity", TEXT),
    ],
    ids=["gzip", "deflate", "raw deflate", "gzip then deflate", "identity"],
)
def test_http_decodes_the_encodings_it_asks_for(
    http_server: HttpServer, encoding: str, packed: bytes
) -> None:
    http_server.respond("/text", body=packed, headers={"Content-Encoding": encoding})

    output = http({"url": f"{http_server.url}/text"}, context()).output

    assert output["body"] == TEXT.decode()
    assert http_server.requests[0].headers["accept-encoding"] == outbound.ACCEPT_ENCODING


def test_http_counts_its_cap_in_decoded_bytes(http_server: HttpServer, settings: Settings) -> None:
    settings.HTTP_TOOL_MAX_RESPONSE_BYTES = len(TEXT) - 1
    http_server.respond("/text", body=gzip.compress(TEXT), headers={"Content-Encoding": "gzip"})

    error = failure({"url": f"{http_server.url}/text"})

    assert error.message == f"response larger than {len(TEXT) - 1} bytes"


@pytest.mark.parametrize(
    ("encoding", "body", "says"),
    [
        ("br", b"\x1b\x03\x00\xf8", "Content-Encoding 'br' is not one read here"),
        ("gzip", b"not gzip at all", "gzip data is corrupt"),
    ],
    ids=["brotli", "corrupt gzip"],
)
def test_http_refuses_an_answer_it_cannot_decode_within_its_bounds(
    http_server: HttpServer, encoding: str, body: bytes, says: str
) -> None:
    http_server.respond("/odd", body=body, headers={"Content-Encoding": encoding})

    error = failure({"url": f"{http_server.url}/odd"})

    assert error.code == "invalid_output"
    assert says in error.message


@pytest.mark.timeout(30)  # without a bound on the whole exchange, it drips for an hour
def test_http_is_cut_at_its_timeout_while_a_server_drips_its_headers(settings: Settings) -> None:
    settings.HTTP_TOOL_ALLOWED_NETWORKS = ["127.0.0.1/32"]
    with DrippingReceiver() as receiver:
        started = time.monotonic()
        error = failure({"url": f"{receiver.url}/slow", "timeout": "500ms"})
        elapsed = time.monotonic() - started
        assert receiver.answered == 1  # the headers had begun: every read succeeded

    assert (error.code, error.retryable) == ("timeout", True)
    assert "no whole answer within 0.5s" in error.message
    assert 0.5 <= elapsed < 0.5 + MARGIN_S


@pytest.mark.timeout(30)
def test_the_step_timeout_bounds_a_dripping_exchange_when_the_request_sets_none(
    settings: Settings,
) -> None:
    settings.HTTP_TOOL_ALLOWED_NETWORKS = ["127.0.0.1/32"]
    with DrippingReceiver() as receiver:
        started = time.monotonic()
        error = failure({"url": f"{receiver.url}/slow"}, context(timeout_s=0.5))
        elapsed = time.monotonic() - started

    assert error.code == "timeout"
    assert 0.5 <= elapsed < 0.5 + MARGIN_S
