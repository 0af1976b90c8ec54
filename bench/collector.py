"""A small OTLP/HTTP trace receiver on the loopback: ``make bench`` with
``BENCH_TRACING=1`` exports to it (it accepts and discards, counting), and the tests
read back what was exported (``keep=True``: every span decoded from the
``ExportTraceServiceRequest`` protobuf, opentelemetry-proto's, which the exporter
depends on).

    python -m bench.collector --port-file PATH   # serve until SIGTERM; print the counts
"""

from __future__ import annotations

import argparse
import gzip
import signal
import sys
import threading
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import FrameType
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

KEPT = 50_000


@dataclass(frozen=True)
class ReceivedSpan:
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str  # "" for a root
    kind: int
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    links: list[tuple[str, str, dict[str, Any]]]  # (trace id, span id, attributes)
    status_code: int
    service: str


def _value(value: AnyValue) -> Any:
    which = value.WhichOneof("value")
    if which == "array_value":
        return [_value(item) for item in value.array_value.values]
    if which == "kvlist_value":
        return {item.key: _value(item.value) for item in value.kvlist_value.values}
    return getattr(value, which) if which else None


def _attributes(items: Any) -> dict[str, Any]:
    return {item.key: _value(item.value) for item in items}


@dataclass
class Collector:
    """Serves ``POST /v1/traces`` on 127.0.0.1 (a free port) in a thread."""

    keep: bool = False
    requests: int = 0
    spans_received: int = 0
    # The latest spans (a test session's worker exports every traced run's).
    received: deque[ReceivedSpan] = field(default_factory=lambda: deque(maxlen=KEPT))
    lock: threading.Lock = field(default_factory=threading.Lock)
    server: ThreadingHTTPServer | None = None

    @property
    def endpoint(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> Collector:
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path != "/v1/traces":
                    self.send_error(404)
                    return
                collector.take(body)
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()

    def take(self, body: bytes) -> None:
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        spans = []
        count = 0
        for resource_spans in request.resource_spans:
            resource = _attributes(resource_spans.resource.attributes)
            for scope_spans in resource_spans.scope_spans:
                count += len(scope_spans.spans)
                if self.keep:
                    spans += [
                        _received(span, str(resource.get("service.name", "")))
                        for span in scope_spans.spans
                    ]
        with self.lock:
            self.requests += 1
            self.spans_received += count
            self.received.extend(spans)

    def spans(self, trace_id: str | None = None) -> list[ReceivedSpan]:
        with self.lock:
            return [s for s in self.received if trace_id is None or s.trace_id == trace_id]


def _received(span: Any, service: str) -> ReceivedSpan:
    return ReceivedSpan(
        name=span.name,
        trace_id=span.trace_id.hex(),
        span_id=span.span_id.hex(),
        parent_span_id=span.parent_span_id.hex(),
        kind=span.kind,
        start_ns=span.start_time_unix_nano,
        end_ns=span.end_time_unix_nano,
        attributes=_attributes(span.attributes),
        links=[
            (link.trace_id.hex(), link.span_id.hex(), _attributes(link.attributes))
            for link in span.links
        ],
        status_code=span.status.code,
        service=service,
    )


def tree(spans: list[ReceivedSpan], since: float | None = None) -> str:
    """One trace's spans as an indented tree, in start order: each span's name, its
    start (ms after ``since``, a Unix time, or after the first span), its length and
    its attributes (``orchestrator.`` dropped); a span whose parent is not among them
    (the client's) is a root."""
    ids = {span.span_id for span in spans}
    first = min(span.start_ns for span in spans) if since is None else int(since * 1e9)
    lines: list[str] = []

    def show(span: ReceivedSpan, depth: int) -> None:
        shown = {
            key.removeprefix("orchestrator."): value
            for key, value in sorted(span.attributes.items())
            if not key.endswith((".id", "url.path", "http.request.method"))
        }
        about = " ".join(f"{key}={value}" for key, value in shown.items())
        links = "".join(f" link->{trace[:8]}:{span_id[:8]}" for trace, span_id, _ in span.links)
        lines.append(
            f"{'  ' * depth}{span.name}  +{(span.start_ns - first) / 1e6:.0f}ms "
            f"{(span.end_ns - span.start_ns) / 1e6:.1f}ms  {about}{links}".rstrip()
        )
        for child in sorted(spans, key=lambda s: s.start_ns):
            if child.parent_span_id == span.span_id:
                show(child, depth + 1)

    for root in sorted(spans, key=lambda s: s.start_ns):
        if root.parent_span_id not in ids:
            show(root, 0)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.collector")
    parser.add_argument("--port-file", required=True, help="where to write the port")
    args = parser.parse_args(argv)
    collector = Collector().start()
    assert collector.server is not None
    stopped = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stopped.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    written = Path(args.port_file + ".tmp")
    written.write_text(str(collector.server.server_address[1]))
    written.rename(args.port_file)  # whole, or not there yet
    stopped.wait()
    collector.stop()
    print(f"collector: {collector.requests} exports, {collector.spans_received} spans")
    return 0


if __name__ == "__main__":
    sys.exit(main())
