"""An API client that behaves like a careful real one under faults.

Every POST carries an `Idempotency-Key`; a request that met a connection error, a 502,
503 or 504, a 429 or a `409 idempotency_key_in_use` is sent again, with the same key and
body, after a short backoff (honouring `Retry-After`), until its deadline. What the
client saw is counted by status and by endpoint, so the harness can report that no
request ever got a 500.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

RETRY_STATUSES = {429, 502, 503, 504}


@dataclass
class Tally:
    """What every client of a harness saw, shared and thread-safe."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    statuses: Counter[int] = field(default_factory=Counter)
    connection_errors: int = 0
    retries: int = 0
    server_errors: list[str] = field(default_factory=list)

    def saw(self, method: str, path: str, status: int, body: str) -> None:
        with self.lock:
            self.statuses[status] += 1
            if status >= 500 and status not in RETRY_STATUSES:
                self.server_errors.append(f"{method} {path} -> {status}: {body[:300]}")


class GaveUp(Exception):
    """A request that still failed at its deadline."""


class Client:
    """``fallbacks``: every web host's URL; a connection error moves the client to the
    next one, as a load balancer in front of several web hosts would."""

    def __init__(
        self,
        base_url: str,
        key: str,
        tally: Tally,
        deadline_s: float = 180.0,
        fallbacks: Sequence[str] = (),
    ) -> None:
        self.key = key
        self.tally = tally
        self.deadline_s = deadline_s
        urls = [base_url, *(url for url in fallbacks if url != base_url)]
        self.hosts = [
            httpx.Client(
                base_url=url,
                headers={"Authorization": f"Bearer {key}"},
                timeout=httpx.Timeout(30.0, connect=3.0),
                trust_env=False,
            )
            for url in urls
        ]
        self.current = 0

    @property
    def http(self) -> httpx.Client:
        return self.hosts[self.current]

    def close(self) -> None:
        for host in self.hosts:
            host.close()

    def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: dict[str, Any] | None = None,
        idempotency_key: str | None = None,
    ) -> httpx.Response:
        """Send until an answer that is not worth retrying, or the deadline."""
        headers = {}
        if method == "POST":
            headers["Idempotency-Key"] = idempotency_key or uuid.uuid4().hex
        deadline = time.monotonic() + self.deadline_s
        delay = 0.1
        while True:
            try:
                response = self.http.request(
                    method, path, json=json, params=params, headers=headers
                )
            except httpx.TransportError as exc:
                with self.tally.lock:
                    self.tally.connection_errors += 1
                last = f"{type(exc).__name__}: {exc}"
                self.current = (self.current + 1) % len(self.hosts)
            else:
                self.tally.saw(method, path, response.status_code, response.text)
                if not self._worth_retrying(response):
                    return response
                last = f"{response.status_code}: {response.text[:200]}"
                retry_after = response.headers.get("Retry-After", "")
                if retry_after.isdigit():
                    delay = max(delay, min(float(retry_after), 5.0))
            if time.monotonic() + delay > deadline:
                raise GaveUp(f"{method} {path}: still failing after {self.deadline_s:g}s: {last}")
            with self.tally.lock:
                self.tally.retries += 1
            time.sleep(delay)  # a client's backoff between attempts, not synchronisation
            delay = min(delay * 2, 2.0)

    @staticmethod
    def _worth_retrying(response: httpx.Response) -> bool:
        if response.status_code in RETRY_STATUSES:
            return True
        if response.status_code == 409:
            try:
                return bool(response.json().get("code") == "idempotency_key_in_use")
            except ValueError:
                return False
        return False
