"""``orch runs events RUN --follow`` and ``Client.stream_events`` on the server's event
stream: the installed ``orch`` against a live server and the real worker (through a proxy
that cuts the stream once, to see it resume), and the client against a scripted server
for the failures the API will not produce on demand."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from orchestrator_client import Client, NotFound
from tests import factories
from tests.client.conftest import Orch, orch_env
from tests.http_fixture import HttpServer
from tests.support import wait_until
from tests.tenants import LiveTenant


def json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines()]


# --------------------------------------------------------------------------- orch, live
@pytest.mark.usefixtures("celery_worker")
@pytest.mark.django_db(transaction=True)
@pytest.mark.integration
def test_follow_prints_every_event_as_listed_and_exits_when_the_run_ends(
    orch: Orch, client: Client
) -> None:
    run = client.submit(factories.sleeper_plan(0.3))

    followed = orch.run("runs", "events", run["id"], "--follow", "--json")
    text = orch.run("runs", "events", run["id"], "--follow")
    after = orch.run("runs", "events", run["id"], "--follow", "--json", "--after", "0")
    transitions = orch.run("runs", "events", run["id"], "--follow", "--json", "--kind", "charge")

    assert followed.returncode == 0, followed.stderr
    events = json_lines(followed.stdout)
    assert events == list(client.events(run["id"]))
    assert client.get_run(run["id"])["status"] == "completed"
    assert "agent-0.task-0.nap (attempt 1)  running -> completed" in text.stdout
    assert text.returncode == 0
    assert json_lines(after.stdout) == events
    charges = [event for event in events if event["kind"] == "charge"]
    assert json_lines(transitions.stdout) == charges != []


class CuttingProxy:
    """A TCP proxy to the live server that closes the first event stream it carries
    right after ``cut_after`` events, as a proxy or a network might. It records the
    ``Last-Event-ID`` of every stream request it carries (None: none sent)."""

    def __init__(self, target: str, cut_after: int) -> None:
        host, port = target.removeprefix("http://").split(":")
        self.target = (host, int(port))
        self.cut_after = cut_after
        self.resumed_from: list[str | None] = []
        self._cut_one = False
        self._lock = threading.Lock()
        self.listener = socket.create_server(("127.0.0.1", 0))
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.listener.getsockname()[1]}"

    def close(self) -> None:
        self.listener.close()

    def _accept(self) -> None:
        while True:
            try:
                downstream, _ = self.listener.accept()
            except OSError:
                return  # closed
            upstream = socket.create_connection(self.target)
            threading.Thread(
                target=self._requests, args=(downstream, upstream), daemon=True
            ).start()

    def _requests(self, downstream: socket.socket, upstream: socket.socket) -> None:
        """Client to server, as it comes (a connection may carry several requests). The
        first stream request of all has its connection's answer cut."""
        answering = False
        while data := _recv(downstream):
            cut = self._stream_request(data) if b"/events/stream" in data else False
            if not answering:
                answering = True
                answers = threading.Thread(target=self._answers, args=(upstream, downstream, cut))
                answers.daemon = True
                answers.start()
            upstream.sendall(data)
        _close(upstream)

    def _stream_request(self, head: bytes) -> bool:
        """Record a stream request's Last-Event-ID; whether it is the one to cut."""
        resumed = None
        for line in head.split(b"\r\n"):
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"last-event-id":
                resumed = value.strip().decode()
        with self._lock:
            self.resumed_from.append(resumed)
            cut, self._cut_one = not self._cut_one, True
        return cut

    def _answers(self, upstream: socket.socket, downstream: socket.socket, cut: bool) -> None:
        """Server to client; for the stream to cut, until its ``cut_after``-th event."""
        sent = 0
        received = b""
        while data := _recv(upstream):
            received += data
            end = _end_of_event(received, self.cut_after) if cut else None
            downstream.sendall(received[sent:end])
            sent = len(received) if end is None else end
            if end is not None:
                break
        _close(downstream)
        _close(upstream)


def _end_of_event(received: bytes, count: int) -> int | None:
    """Where the ``count``-th event block of a response ends (after its blank line)."""
    position = found = 0
    while (blank := received.find(b"\n\n", position)) != -1:
        block = received[position:blank]
        if block.startswith(b"id: "):
            found += 1
            if found == count:
                return blank + 2
        position = blank + 2
    return None


def _recv(sock: socket.socket) -> bytes:
    try:
        return sock.recv(65536)
    except OSError:
        return b""


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()


@pytest.fixture
def proxy(tenant: LiveTenant) -> Iterator[CuttingProxy]:
    cutter = CuttingProxy(tenant.url, cut_after=3)
    yield cutter
    cutter.close()


@pytest.mark.usefixtures("celery_worker")
@pytest.mark.django_db(transaction=True)
@pytest.mark.integration
def test_follow_resumes_a_cut_stream_by_last_event_id_with_no_gap_or_repeat(
    orch: Orch, client: Client, tenant: LiveTenant, proxy: CuttingProxy
) -> None:
    run = client.submit(factories.approval_plan())
    through = Orch(orch_env(orch.cwd, ORCH_URL=proxy.url, ORCH_API_KEY=tenant.key), orch.cwd)

    following = through.start("runs", "events", run["id"], "--follow", "--json")
    try:
        # Cut after three events, the run waiting for its gate: orch comes back for more.
        wait_until(lambda: len(proxy.resumed_from) >= 2, what="orch to open the stream again")
        client.approve(run["id"])
        out, err = following.communicate(timeout=60)
    finally:
        following.kill()
        following.wait()

    assert following.returncode == 0, err
    events = json_lines(out)
    assert events == list(client.events(run["id"]))
    assert proxy.resumed_from[:2] == [None, str(events[2]["id"])]
    assert client.get_run(run["id"])["status"] == "completed"


@pytest.mark.django_db(transaction=True)
@pytest.mark.integration
def test_follow_of_another_organizations_run_is_an_error(orch: Orch) -> None:
    theirs = factories.run(factories.org())

    result = orch.run("runs", "events", str(theirs.pk), "--follow")

    assert result.returncode == 1
    assert "not_found" in result.stderr


# --------------------------------------------------------------------------- the client
RUN = "61a448da-43eb-4322-aba2-d45c2a8ffb89"
STREAM = f"/api/v1/runs/{RUN}/events/stream"


def event(event_id: int) -> dict[str, Any]:
    return {
        "id": event_id,
        "attempt_number": 1,
        "entity": "run",
        "entity_id": RUN,
        "path": "",
        "kind": "operator",
        "from_status": "",
        "to_status": "",
        "actor": "test",
        "message": f"event {event_id}",
        "payload": {},
        "created_at": "2026-01-01T00:00:00Z",
    }


def frame(event_id: int) -> bytes:
    return f"id: {event_id}\ndata: {json.dumps(event(event_id))}\n\n".encode()


SSE = {"Content-Type": "text/event-stream"}


def scripted_client(server: HttpServer) -> Client:
    return Client(server.url, "ork_test", retries=2, sleep=lambda seconds: None)


def test_a_dropped_stream_is_opened_again_after_the_last_event_received(
    http_server: HttpServer,
) -> None:
    # Cut mid-body (the connection closes short of its Content-Length), then a stream
    # that ends cleanly, the run ended; then nothing more in the list.
    cut = {**SSE, "Content-Length": "100000"}
    http_server.respond(
        STREAM, headers=cut, chunks=[b": keepalive\n\n", frame(1), frame(2)], times=1
    )
    http_server.respond(STREAM, headers=SSE, chunks=[frame(3)], times=1)
    http_server.respond(f"/api/v1/runs/{RUN}", json={"id": RUN, "status": "completed"})
    http_server.respond(f"/api/v1/runs/{RUN}/events", json={"next": None, "results": []})

    with scripted_client(http_server) as api:
        received = [e["id"] for e in api.stream_events(RUN)]

    streams = [r for r in http_server.requests if r.path == STREAM]
    assert received == [1, 2, 3]
    assert [r.headers.get("last-event-id") for r in streams] == [None, "2"]
    assert {r.headers["accept"] for r in streams} == {"text/event-stream"}
    after = [r.query for r in http_server.requests if r.path.endswith("/events")]
    assert after == [{"after": ["3"], "page_size": ["500"]}]


def test_a_stream_that_ends_before_its_run_is_resumed_and_the_list_read_at_the_end(
    http_server: HttpServer,
) -> None:
    http_server.respond(STREAM, headers=SSE, chunks=[frame(5)], times=1)
    http_server.respond(STREAM, headers=SSE, chunks=[frame(6)], times=1)
    http_server.respond(f"/api/v1/runs/{RUN}", json={"id": RUN, "status": "running"}, times=1)
    http_server.respond(f"/api/v1/runs/{RUN}", json={"id": RUN, "status": "failed"})
    # What a proxy cut from the end of the second stream: read from the list.
    http_server.respond(f"/api/v1/runs/{RUN}/events", json={"next": None, "results": [event(7)]})

    with scripted_client(http_server) as api:
        received = [e["id"] for e in api.stream_events(RUN, last_event_id=4)]

    streams = [r for r in http_server.requests if r.path == STREAM]
    assert received == [5, 6, 7]
    assert [r.headers.get("last-event-id") for r in streams] == ["4", "5"]


def test_an_api_error_is_raised_and_a_503_retried(http_server: HttpServer) -> None:
    http_server.respond(
        STREAM, status=503, json={"code": "service_unavailable", "message": "x"}, times=1
    )
    http_server.respond(STREAM, status=404, json={"code": "not_found", "message": "not found"})

    with scripted_client(http_server) as api, pytest.raises(NotFound):
        list(api.stream_events(RUN))

    assert len([r for r in http_server.requests if r.path == STREAM]) == 2
