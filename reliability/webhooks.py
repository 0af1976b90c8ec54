"""Run webhooks through the storm (docs/webhooks.md, docs/reliability.md): the harness
registers an endpoint for its organization's run events, answered by a receiver on its
own address that fails a third of the requests (500), and the report checks that every
run that ended was told at least once, that no delivery was lost or given up, and that
every request was signed with the endpoint's secret."""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import random
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from reliability.client import Client

EVENTS = ["run.completed", "run.failed", "run.cancelled", "run.waiting_approval"]
FAIL_SHARE = 1 / 3
TERMINAL = ("completed", "failed", "cancelled")


@dataclass
class Received:
    """What the receiver saw: every request, and the deliveries it answered 2xx."""

    requests: int = 0
    failed_on_purpose: int = 0
    bad_signatures: int = 0
    # (run id, event type) of every delivery answered 2xx; delivery ids answered 2xx.
    told: set[tuple[str, str]] = field(default_factory=set)
    delivered_ids: set[str] = field(default_factory=set)


class WebhookReceiver:
    """An HTTP endpoint that answers 500 to ``fail_share`` of the requests (drawn from
    ``seed``), 200 to the rest, and checks each request's signature once ``secret`` is
    known."""

    def __init__(self, host: str, seed: int, fail_share: float = FAIL_SHARE) -> None:
        self.received = Received()
        self.secret = ""
        lock = threading.Lock()
        draw = random.Random(seed)
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                signed = receiver.verify(self.headers.get("X-Orchestrator-Signature", ""), body)
                with lock:
                    seen = receiver.received
                    seen.requests += 1
                    seen.bad_signatures += 0 if signed else 1
                    fail = draw.random() < fail_share
                    if fail:
                        seen.failed_on_purpose += 1
                    else:
                        with contextlib.suppress(ValueError, KeyError, TypeError):
                            content = json.loads(body)
                            seen.delivered_ids.add(str(content["id"]))
                            run = content.get("run") or {}
                            seen.told.add((str(run.get("id")), str(content["type"])))
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    self.send_response(500 if fail else 200)
                    self.send_header("Content-Length", "0")
                    self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                return

        self._server = ThreadingHTTPServer((host, 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        self.url = f"http://{host}:{self._server.server_address[1]}/hooks"

    def verify(self, header: str, body: bytes, tolerance: int = 300) -> bool:
        """docs/webhooks.md's verification."""
        try:
            parts = dict(item.split("=", 1) for item in header.split(","))
            stamp = int(parts["t"])
        except (ValueError, KeyError):
            return False
        expected = hmac.new(
            self.secret.encode(), parts["t"].encode() + b"." + body, hashlib.sha256
        ).hexdigest()
        return abs(time.time() - stamp) <= tolerance and hmac.compare_digest(
            expected, parts.get("v1", "")
        )

    def register(self, client: Client) -> None:
        """The organization's endpoint, over the API; its secret kept for checking."""
        answer = client.request(
            "POST", "/api/v1/webhooks", json={"url": self.url, "events": EVENTS}
        )
        client.close()
        if answer.status_code != 201:
            raise RuntimeError(
                f"could not register the webhook: {answer.status_code} {answer.text}"
            )
        self.secret = str(answer.json()["secret"])

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def pending_deliveries() -> int:
    from webhooks.models import DeliveryStatus, WebhookDelivery

    return WebhookDelivery.objects.filter(status=DeliveryStatus.PENDING).count()


def webhook_report(receiver: WebhookReceiver) -> dict[str, Any]:
    """Every run that ended in an organization registered at this receiver (the storm's,
    the schedule's, child runs; not chaos-net's probe runs, whose organization has no
    endpoint) was told its end at least once (answered 2xx); every delivery written was
    delivered, none pending or given up; every request signed."""
    from runs.models import Run
    from webhooks.models import DeliveryStatus, WebhookDelivery, WebhookEndpoint

    registered = WebhookEndpoint.objects.filter(url=receiver.url).values("organization_id")
    ended = list(
        Run.objects.filter(status__in=TERMINAL, organization_id__in=registered).values_list(
            "pk", "status"
        )
    )
    seen = receiver.received
    untold = [str(pk) for pk, status in ended if (str(pk), f"run.{status}") not in seen.told]
    rows = list(WebhookDelivery.objects.values_list("uid", "status"))
    by_status: dict[str, int] = {}
    for _, status in rows:
        by_status[status] = by_status.get(status, 0) + 1
    lost = [
        str(uid)
        for uid, status in rows
        if status != DeliveryStatus.DELIVERED or str(uid) not in seen.delivered_ids
    ]
    report = {
        "receiver_fail_share": round(FAIL_SHARE, 3),
        "requests": seen.requests,
        "answered_500_on_purpose": seen.failed_on_purpose,
        "deliveries": len(rows),
        "deliveries_by_status": by_status,
        "terminal_runs": len(ended),
        "terminal_runs_not_told": untold,
        "deliveries_lost": lost,
        "bad_signatures": seen.bad_signatures,
    }
    report["ok"] = bool(ended and rows and not untold and not lost and not seen.bad_signatures)
    return report
