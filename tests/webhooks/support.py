"""Helpers of the webhook tests: endpoints, and a receiver's view of a delivery."""

from __future__ import annotations

import hashlib
import hmac
import socket
import threading
from typing import Any

from billing.models import Organization
from tests.http_fixture import RecordedRequest
from webhooks import services
from webhooks.models import WebhookEndpoint

SECRET = "webhook-test-secret-0123456789"
ALL_EVENTS = ["run.completed", "run.failed", "run.cancelled", "run.waiting_approval"]


def endpoint(
    organization: Organization, url: str = "http://127.0.0.1:9/hook", **fields: Any
) -> WebhookEndpoint:
    fields.setdefault("events", [*ALL_EVENTS, "escalation.opened"])
    fields.setdefault("secret", SECRET)
    created, _ = services.endpoint_create(organization=organization, url=url, **fields)
    return created


def verify(secret: str, header: str, body: bytes, now: float, tolerance: int = 300) -> bool:
    """docs/webhooks.md's verification, as a receiver writes it."""
    parts = dict(item.split("=", 1) for item in header.split(","))
    signed = parts["t"].encode() + b"." + body
    expected = hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()
    fresh = abs(now - int(parts["t"])) <= tolerance
    return fresh and hmac.compare_digest(expected, parts["v1"])


def delivery_ids(requests: list[RecordedRequest]) -> list[str]:
    return [request.headers["x-orchestrator-delivery"] for request in requests]


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
