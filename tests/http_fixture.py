"""A real HTTP server on 127.0.0.1 for tests, scripted per path.

Use it with ``pytest_plugins = ["tests.http_fixture"]`` and the ``http_server`` fixture::

    http_server.respond("/items", status=429, times=2)   # the first two calls
    http_server.respond("/items", json={"items": [1]})   # every call after those
    ... call f"{http_server.url}/items" ...
    assert [r.method for r in http_server.requests] == ["GET", "GET", "GET"]

Each path has a queue of scripted responses: one with ``times=N`` answers N requests
and is then used up, one with ``times=None`` answers every request from then on. A path
with nothing scripted answers 404. ``chat_completion()`` scripts an OpenAI-compatible
``/v1/chat/completions`` (point LLM_BASE_URL at ``http_server.llm_base_url``).

Handlers that simulate a slow server (``delay``) wait on an event that teardown sets,
so stopping the server never waits for a delay to run out.

Hostile servers, for the bounds of ``orchestrator.outbound``: ``gzip_bomb()`` is a body
that inflates a thousandfold, ``DrippingReceiver`` answers its headers a byte at a time.
"""

from __future__ import annotations

import contextlib
import functools
import json as jsonlib
import socket
import threading
import tracemalloc
import uuid
import zlib
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

CHAT_COMPLETIONS_PATH = "/v1/chat/completions"


@dataclass(frozen=True)
class RecordedRequest:
    method: str
    path: str  # without the query string
    query: dict[str, list[str]]
    headers: dict[str, str]  # names in lower case
    body: bytes

    def json(self) -> Any:
        return jsonlib.loads(self.body)


@dataclass
class ScriptedResponse:
    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    times: int | None = None  # None: answers every request from now on
    # Streamed instead of `body`: no Content-Length, chunk_delay before each chunk.
    chunks: tuple[bytes, ...] | None = None
    chunk_delay: float = 0.0


class HttpServer:
    """A ThreadingHTTPServer in a background thread, answering what tests script."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._scripts: dict[str, deque[ScriptedResponse]] = {}
        self._requests: list[RecordedRequest] = []
        self._closing = threading.Event()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        # Handler threads are joined at close; their delays end when _closing is set.
        self._server.daemon_threads = False
        self._server.block_on_close = True
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="http-fixture",
            daemon=True,
        )
        self._thread.start()

    # ------------------------------------------------------------------ what tests use
    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def llm_base_url(self) -> str:
        return f"{self.url}/v1"

    @property
    def requests(self) -> list[RecordedRequest]:
        with self._lock:
            return list(self._requests)

    def reset(self) -> None:
        """Forget what was scripted and received (a server shared by several tests)."""
        with self._lock:
            self._scripts.clear()
            self._requests.clear()

    def respond(
        self,
        path: str,
        *,
        status: int = 200,
        json: Any = None,
        body: bytes | str = b"",
        headers: dict[str, str] | None = None,
        delay: float = 0.0,
        times: int | None = None,
        chunks: list[bytes] | None = None,
        chunk_delay: float = 0.0,
    ) -> None:
        """Queue a response for `path`.

        `json` sets the body and its content type; `delay` waits before answering;
        `chunks` streams a body piece by piece, `chunk_delay` before each piece.
        """
        headers = dict(headers or {})
        if json is not None:
            body = jsonlib.dumps(json).encode()
            headers.setdefault("Content-Type", "application/json")
        elif isinstance(body, str):
            body = body.encode()
        if times is not None and times < 1:
            raise ValueError("times must be at least 1 (or None for every request)")
        script = ScriptedResponse(
            status,
            body,
            headers,
            delay,
            times,
            None if chunks is None else tuple(chunks),
            chunk_delay,
        )
        with self._lock:
            self._scripts.setdefault(path, deque()).append(script)

    def chat_completion(
        self,
        content: str = "Hello from the test model.",
        total_tokens: int = 30,
        status: int = 200,
        *,
        times: int | None = None,
        delay: float = 0.0,
    ) -> None:
        """Script an OpenAI-compatible chat completion (or, for status >= 400, its error)."""
        if status >= 400:
            error = {"error": {"message": f"scripted error {status}", "type": "test_error"}}
            self.respond(CHAT_COMPLETIONS_PATH, status=status, json=error, times=times)
            return
        prompt_tokens = total_tokens // 2
        answer = {
            "id": f"chatcmpl-{uuid.uuid4().hex[:12]}",
            "object": "chat.completion",
            "model": "test-model",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": content},
                    "finish_reason": "stop",
                }
            ],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": total_tokens - prompt_tokens,
                "total_tokens": total_tokens,
            },
        }
        self.respond(CHAT_COMPLETIONS_PATH, status=status, json=answer, times=times, delay=delay)

    def close(self) -> None:
        self._closing.set()
        self._server.shutdown()
        self._thread.join()
        self._server.server_close()  # joins the handler threads

    def __enter__(self) -> HttpServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ handler side
    def _record_and_pick(self, request: RecordedRequest) -> ScriptedResponse:
        with self._lock:
            self._requests.append(request)
            queue = self._scripts.get(request.path)
            if not queue:
                message = {"error": f"no response scripted for {request.path}"}
                return ScriptedResponse(
                    404, jsonlib.dumps(message).encode(), {"Content-Type": "application/json"}
                )
            script = queue[0]
            if script.times is not None:
                script.times -= 1
                if script.times == 0:
                    queue.popleft()
            return script

    def _wait(self, seconds: float) -> None:
        if seconds > 0:
            self._closing.wait(seconds)


def _handler_for(server: HttpServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        # One request per connection (HTTP/1.0), so no thread waits on an idle keep-alive.
        protocol_version = "HTTP/1.0"
        timeout = 10  # a client that connects and sends nothing cannot hold teardown

        def _answer(self) -> None:
            split = urlsplit(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            request = RecordedRequest(
                method=self.command,
                path=split.path,
                query=parse_qs(split.query, keep_blank_values=True),
                headers={name.lower(): value for name, value in self.headers.items()},
                body=self.rfile.read(length) if length else b"",
            )
            script = server._record_and_pick(request)
            server._wait(script.delay)
            try:
                self.send_response(script.status)
                for name, value in script.headers.items():
                    self.send_header(name, value)
                streamed = script.chunks is not None
                if not streamed and "content-length" not in {n.lower() for n in script.headers}:
                    self.send_header("Content-Length", str(len(script.body)))
                self.end_headers()
                if self.command == "HEAD":
                    return
                for chunk in script.chunks or (script.body,):
                    if streamed:
                        server._wait(script.chunk_delay)
                    self.wfile.write(chunk)
                    self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (a timeout test): nothing left to tell it

        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = _answer

        def log_message(self, format: str, *args: Any) -> None:
            pass  # tests assert on server.requests; the access log is noise

    return Handler


@pytest.fixture(scope="session")
def llm_server() -> Iterator[HttpServer]:
    """An OpenAI-compatible server for the whole session: the session's worker is
    started with LLM_BASE_URL pointing at it (its planner and llm steps call it). Tests
    that use it script it afresh (``reset``)."""
    with HttpServer() as server:
        yield server


@pytest.fixture
def http_server(settings: Any) -> Iterator[HttpServer]:
    # The http tool refuses loopback (orchestrator/netguard.py): this test allows the
    # server's own address, and only for itself.
    settings.HTTP_TOOL_ALLOWED_NETWORKS = ["127.0.0.1/32"]
    with HttpServer() as server:
        yield server


# What reading a bomb may hold at its peak (Python's allocations, traced): a few pieces of
# the decoder and the body up to its cap; a reader that inflates a 64 KiB chunk whole
# holds 64 MiB.
MEMORY_BOUND = 16 << 20


@contextlib.contextmanager
def peak_memory() -> Iterator[Callable[[], int]]:
    """Trace the allocations of the block; what it yields tells their peak, in bytes."""
    tracemalloc.start()
    peak = [0]
    try:
        yield lambda: peak[0]
    finally:
        peak[0] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()


@functools.cache
def gzip_bomb(size: int = 256 << 20) -> bytes:
    """``size`` zero bytes gzip-compressed: 256 MiB in about 255 KiB. Served with
    ``Content-Encoding: gzip``, a reader that inflates before it counts holds a thousand
    times what came over the wire."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    zeros = bytes(1 << 20)
    packed = [packer.compress(zeros) for _ in range(size >> 20)]
    return b"".join([*packed, packer.flush()])


class DrippingReceiver:
    """A receiver on 127.0.0.1 that takes the request, then sends its answer's headers a
    byte at a time, every ``interval`` s, never finishing them: each read of the sender's
    succeeds, only a bound on the whole exchange ends it. ``answered`` counts the
    requests it began to answer. A context manager: leaving it closes every connection."""

    def __init__(self, interval: float = 0.05) -> None:
        self.interval = interval
        self.answered = 0
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._listener.getsockname()[1]}"

    def _accept(self) -> None:
        self._listener.settimeout(0.1)
        while not self._closing.is_set():
            try:
                connection, _ = self._listener.accept()
            except TimeoutError:
                continue
            thread = threading.Thread(target=self._drip, args=(connection,), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _drip(self, connection: socket.socket) -> None:
        with connection:
            received = b""
            while b"\r\n\r\n" not in received:  # the request's head (its body is small)
                chunk = connection.recv(65536)
                if not chunk:
                    return
                received += chunk
            with self._lock:
                self.answered += 1
            head = b"HTTP/1.1 200 OK\r\n" + b"X-Drip: " + b"." * 100_000
            for byte in head:
                if self._closing.wait(self.interval):
                    return
                try:
                    connection.sendall(bytes([byte]))
                except OSError:  # the sender gave up: what this receiver is for
                    return

    def __enter__(self) -> DrippingReceiver:
        return self

    def __exit__(self, *exc: object) -> None:
        self._closing.set()
        self._threads[0].join(timeout=5)  # accepts no more: the list is whole
        for thread in self._threads[1:]:
            thread.join(timeout=5)
        self._listener.close()
