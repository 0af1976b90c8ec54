"""A client that stops reading its run's event stream, against gunicorn with the real
config/gunicorn.py (gevent workers): the stream's write blocks once the connection's
buffers are full, and the server drops the client after API_STREAM_SEND_TIMEOUT_S,
freeing its place, instead of holding it for good (api/streams.py, ``Leased``).

The client is a plain socket on 127.0.0.1 with a small receive buffer that reads
nothing; the run's events (10 MB of them) are more than the server's send buffer and
the client's receive buffer hold together."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from urllib.parse import urlsplit

import httpx
import pytest

from billing.models import ApiKey, Organization
from billing.services import api_key_revoke
from common.eventstreams import streams_open
from runs.models import EventKind, Run
from runs.transitions import record_event
from tests import factories
from tests.api.sse import stream_url
from tests.integration.web_support import Web, gunicorn
from tests.support import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

HEARTBEAT_S = 2
SEND_TIMEOUT_S = 1
# A stalled stream's lease would lapse by itself this long after its last renewal (two
# heartbeats, the send timeout and 10 s): the drop must free the place well before.
LAPSE_S = 2 * HEARTBEAT_S + SEND_TIMEOUT_S + 10
EVENTS, EVENT_BYTES = 100, 100_000


@pytest.fixture(scope="module")
def web(django_db_setup: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Web]:
    with gunicorn(
        tmp_path_factory,
        API_STREAM_HEARTBEAT_S=str(HEARTBEAT_S),
        API_STREAM_SEND_TIMEOUT_S=str(SEND_TIMEOUT_S),
    ) as web:
        yield web


def loud_run(organization: Organization) -> Run:
    """A run with 10 MB of events: its stream's first write is that large."""
    run = factories.run(organization)
    for n in range(EVENTS):
        filler = {"x": "x" * EVENT_BYTES}
        record_event(run, EventKind.OPERATOR, message=f"filler {n}", payload=filler)
    return run


def stalled(web: Web, run: Run, key: str) -> socket.socket:
    """A client that asks for the run's stream and then reads nothing."""
    address = urlsplit(web.url)
    client = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: the window
    client.connect((address.hostname, address.port))
    path = urlsplit(stream_url(web.url, run.pk)).path
    client.sendall(
        f"GET {path} HTTP/1.1\r\nHost: {address.netloc}\r\nAuthorization: Bearer {key}\r\n"
        "Accept: text/event-stream\r\n\r\n".encode()
    )
    return client


def drained(client: socket.socket) -> int:
    """Read what the server sent until it closed the connection; the bytes read."""
    client.settimeout(30)
    read = 0
    with client:
        while chunk := client.recv(1 << 20):
            read += len(chunk)
    return read


def test_a_client_that_stops_reading_is_dropped_and_its_place_freed(web: Web) -> None:
    organization, key = factories.org_with_key()
    run = loud_run(organization)

    client = stalled(web, run, key)
    wait_until(lambda: streams_open(organization.pk) == 1, what="the stream to open")
    wait_until(
        lambda: streams_open(organization.pk) == 0,
        timeout=LAPSE_S - 2,
        what="the stalled client to be dropped and its place freed",
    )

    # The server closed the connection: what it had written reaches the client, then the
    # end, short of the run's events.
    assert drained(client) < EVENTS * EVENT_BYTES
    assert "dropped: the client took no write for 1 s" in web.log.read_text(errors="replace")


def test_a_stalled_clients_stream_ends_with_its_keys_revocation(web: Web) -> None:
    organization, key = factories.org_with_key()
    run = loud_run(organization)

    client = stalled(web, run, key)
    wait_until(lambda: streams_open(organization.pk) == 1, what="the stream to open")
    api_key_revoke(api_key=ApiKey.objects.get(organization=organization))
    wait_until(
        lambda: streams_open(organization.pk) == 0,
        timeout=LAPSE_S - 2,
        what="the revoked key's stalled stream to end",
    )

    assert drained(client) < EVENTS * EVENT_BYTES
    again = httpx.get(
        stream_url(web.url, run.pk), headers={"Authorization": f"Bearer {key}"}, timeout=10
    )
    assert again.status_code == 401
