"""The http tool's address guard (orchestrator/netguard.py).

Other ranges than loopback are checked at the classification and resolution layer only:
no test here opens a connection to a non-loopback address, not even one it expects to be
refused (the autouse fixture fails any test that tries). Live connections go to the
local test server on 127.0.0.1, with the allow-list set so that the address under test
is not allowed.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
import time
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from common.errors import is_retryable
from common.tools.base import ToolContext, ToolError
from orchestrator import executor, netguard
from orchestrator.netguard import AddressNotAllowed, check_address, classify, parse_networks
from orchestrator.tools.builtin import http, validate_http
from runs import services
from runs.engine import control
from runs.engine.retry import decide
from runs.engine.start import run_start
from runs.models import Run, Step
from tests import factories

if TYPE_CHECKING:
    from pytest_django.fixtures import Settings as SettingsWrapper

    from tests.http_fixture import HttpServer

LOOPBACK = (ipaddress.ip_network("127.0.0.0/8"), ipaddress.ip_network("::1/128"))


@pytest.fixture(autouse=True)
def _only_loopback_connections(monkeypatch: pytest.MonkeyPatch) -> None:
    """A guard bug must never send a packet off this machine: refuse it here first."""
    real_connect = socket.socket.connect

    def connect(sock: socket.socket, address: Any) -> Any:
        host = address[0] if isinstance(address, tuple) else None
        if host is not None:
            ip = ipaddress.ip_address(str(host).split("%", 1)[0])
            if not any(ip in network for network in LOOPBACK):
                raise AssertionError(f"test tried to connect to non-loopback {address}")
        return real_connect(sock, address)

    monkeypatch.setattr(socket.socket, "connect", connect)


def context() -> ToolContext:
    return ToolContext(step_id=1, run_id="r", attempt=1, timeout_s=5)


def refused(params: dict[str, Any]) -> ToolError:
    with pytest.raises(ToolError) as caught:
        http(params, context())
    return caught.value


# --------------------------------------------------------------------------- classification
@pytest.mark.parametrize(
    ("address", "kind"),
    [
        ("127.0.0.1", "loopback"),
        ("127.255.0.9", "loopback"),
        ("::1", "loopback"),
        ("::ffff:127.0.0.1", "loopback"),  # IPv4-mapped IPv6
        ("2002:7f00:1::", "loopback"),  # 6to4 of 127.0.0.1
        ("64:ff9b::7f00:1", "loopback"),  # NAT64 of 127.0.0.1
        ("0.0.0.0", "unspecified"),  # noqa: S104 - classified, never bound
        ("::", "unspecified"),
        ("169.254.169.254", "link-local"),  # cloud metadata
        ("fe80::1", "link-local"),
        ("::ffff:169.254.169.254", "link-local"),
        ("10.0.0.7", "private"),
        ("172.16.0.1", "private"),
        ("172.31.255.254", "private"),
        ("192.168.1.1", "private"),
        ("fc00::1", "private"),
        ("fd12:3456::1", "private"),
        ("2002:c0a8:101::", "private"),  # 6to4 of 192.168.1.1
        ("100.64.0.1", "shared (carrier-grade NAT)"),
        ("224.0.0.1", "multicast"),
        ("239.255.255.250", "multicast"),
        ("ff02::1", "multicast"),
        ("240.0.0.1", "reserved"),
        ("255.255.255.255", "reserved"),  # broadcast
        ("fec0::1", "site-local"),
        ("192.0.2.10", "private"),  # documentation ranges are not routable either
    ],
)
def test_every_refused_class_is_named(address: str, kind: str) -> None:
    assert classify(ipaddress.ip_address(address)) == kind


@pytest.mark.parametrize("address", ["93.184.215.14", "1.1.1.1", "2606:4700:4700::1111"])
def test_public_addresses_are_allowed(address: str) -> None:
    assert classify(ipaddress.ip_address(address)) is None
    check_address("example.org", ipaddress.ip_address(address))  # does not raise


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        ("2130706433", "127.0.0.1"),  # decimal integer
        ("127.1", "127.0.0.1"),  # short form
        ("0x7f.0.0.1", "127.0.0.1"),  # hex
        ("0177.0.0.1", "127.0.0.1"),  # octal
        ("0", "0.0.0.0"),  # noqa: S104 - resolved, never bound
    ],
)
def test_other_notations_resolve_to_the_address_they_stand_for(host: str, expected: str) -> None:
    assert netguard.resolve(host, 80) == [ipaddress.ip_address(expected)]
    with pytest.raises(AddressNotAllowed):
        netguard.checked_addresses(host, 80, ())


def test_an_allowed_network_lifts_the_refusal_only_inside_it() -> None:
    allowed = parse_networks(("10.1.2.0/24", "127.0.0.1/32"))

    check_address("api.internal", ipaddress.ip_address("10.1.2.3"), allowed)
    check_address("localhost", ipaddress.ip_address("127.0.0.1"), allowed)
    check_address("mapped", ipaddress.ip_address("::ffff:10.1.2.3"), allowed)
    for outside in ("10.1.3.1", "127.0.0.2", "169.254.169.254"):
        with pytest.raises(AddressNotAllowed):
            check_address("x", ipaddress.ip_address(outside), allowed)


# --------------------------------------------------------------------------- resolution
def fake_dns(monkeypatch: pytest.MonkeyPatch, answers: dict[str, list[str]]) -> list[str]:
    """getaddrinfo answering ``answers``; returns the names asked, in order."""
    asked: list[str] = []
    real = socket.getaddrinfo

    def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        if host in answers:
            asked.append(host)
            return [
                (socket.AF_INET6 if ":" in a else socket.AF_INET, socket.SOCK_STREAM, 6, "",
                 (a, port))
                for a in answers[host]
            ]  # fmt: skip
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return asked


def test_a_name_that_resolves_to_a_private_address_is_refused_before_connecting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked = fake_dns(monkeypatch, {"internal.example": ["10.0.0.7"]})

    error = refused({"url": "http://internal.example/admin"})

    assert asked == ["internal.example"]
    assert error.code == "address_not_allowed"
    assert not error.retryable
    assert "internal.example (10.0.0.7) is a private address" in error.message


def test_a_name_with_one_refused_answer_among_public_ones_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake_dns(monkeypatch, {"mixed.example": ["93.184.215.14", "169.254.169.254"]})

    error = refused({"url": "https://mixed.example/"})

    assert error.code == "address_not_allowed"
    assert "link-local" in error.message


def test_the_metadata_address_in_a_url_is_refused_without_a_connection() -> None:
    error = refused({"url": "http://169.254.169.254/latest/meta-data/"})

    assert error.code == "address_not_allowed"


# --------------------------------------------------------------------------- live, on loopback
def test_a_loopback_server_is_refused_unless_allowed(
    http_server: HttpServer, settings: SettingsWrapper
) -> None:
    http_server.respond("/secret", json={"password": "hunter2"})
    settings.HTTP_TOOL_ALLOWED_NETWORKS = ["10.0.0.0/8"]  # some other network

    error = refused({"url": f"{http_server.url}/secret"})

    assert error.code == "address_not_allowed"
    assert "127.0.0.1 is a loopback address; the http tool may not connect to it" in (error.message)
    assert http_server.requests == []


@pytest.mark.parametrize(
    "host", ["2130706433", "127.1", "[::ffff:127.0.0.1]", "localhost", "0x7f.0.0.1"]
)
def test_every_notation_of_the_loopback_server_is_refused(
    host: str, http_server: HttpServer, settings: SettingsWrapper
) -> None:
    http_server.respond("/", json={})
    settings.HTTP_TOOL_ALLOWED_NETWORKS = []

    error = refused({"url": f"http://{host}:{http_server.port}/"})

    assert error.code == "address_not_allowed", error.message
    assert http_server.requests == []


def test_a_redirect_to_a_refused_address_is_refused(http_server: HttpServer) -> None:
    # 127.0.0.1 is allowed (the fixture), 127.0.0.2 is loopback and not allowed.
    http_server.respond(
        "/hop", status=302, headers={"Location": f"http://127.0.0.2:{http_server.port}/x"}
    )

    error = refused({"url": f"{http_server.url}/hop", "follow_redirects": True})

    assert error.code == "address_not_allowed"
    assert "127.0.0.2" in error.message
    assert [r.path for r in http_server.requests] == ["/hop"]


def test_allowed_redirects_are_followed_and_every_hop_is_checked(
    http_server: HttpServer,
) -> None:
    http_server.respond("/a", status=301, headers={"Location": "/b"})
    http_server.respond("/b", json={"here": True})

    result = http({"url": f"{http_server.url}/a", "follow_redirects": True}, context())

    assert result.output["status"] == 200
    assert result.output["body"] == {"here": True}


def test_without_follow_redirects_a_3xx_is_returned_as_before(http_server: HttpServer) -> None:
    http_server.respond("/a", status=302, headers={"Location": "http://169.254.169.254/"})

    result = http({"url": f"{http_server.url}/a"}, context())

    assert result.output["status"] == 302


def test_a_proxy_in_the_environment_cannot_bypass_the_guard(
    http_server: HttpServer, settings: SettingsWrapper, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HTTP_PROXY", http_server.url)  # an allowed proxy on loopback
    monkeypatch.setenv("http_proxy", http_server.url)
    fake_dns(monkeypatch, {"internal.example": ["10.0.0.7"]})

    error = refused({"url": "http://internal.example/"})

    assert error.code == "address_not_allowed"
    assert http_server.requests == []


def test_follow_redirects_must_be_a_boolean() -> None:
    assert validate_http({"url": "https://example.org", "follow_redirects": "yes"}) == [
        ("follow_redirects", "must be true or false")
    ]


def test_address_not_allowed_is_never_retried() -> None:
    assert not is_retryable("address_not_allowed")
    decision = decide(
        {"max_attempts": 5}, code="address_not_allowed", retryable=False, attempts=1, failures=1
    )
    assert not decision.retry


# --------------------------------------------------------------------------- a deadline
def test_a_deadline_bounds_a_look_up_that_does_not_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    asked = threading.Event()
    released = threading.Event()

    def stuck(host: str, port: int) -> list[netguard.IPAddress]:
        asked.set()
        released.wait(30)  # a resolver that does not answer, until the test is over
        return []

    monkeypatch.setattr(netguard, "resolve", stuck)
    try:
        # Given up at the deadline (unbounded, it would end "resolved to no address"). The
        # deadline leaves the client time to reach the look-up on a loaded machine: with
        # 0.3 s it sometimes passed before, and the look-up was never asked.
        began = time.monotonic()
        with (
            netguard.guarded_client([], deadline=began + 2.0) as client,
            pytest.raises(httpx.ConnectTimeout, match=r"resolving hooks\.example\.com"),
        ):
            client.get("http://hooks.example.com/")
        assert asked.is_set()
        assert time.monotonic() - began < 10  # the resolver would have held it 30 s
    finally:
        released.set()


def test_a_deadline_bounds_the_whole_exchange_not_each_read(http_server: HttpServer) -> None:
    # Each chunk comes well within the read timeout; all of them take longer than the deadline.
    http_server.respond("/drip", chunks=[b"x"] * 20, chunk_delay=0.05)
    allowed = ["127.0.0.0/8"]
    with netguard.guarded_client(allowed, timeout=1.0) as unbounded:
        assert unbounded.get(f"{http_server.url}/drip").content == b"x" * 20
    with (
        netguard.guarded_client(allowed, timeout=1.0, deadline=time.monotonic() + 0.4) as client,
        pytest.raises(httpx.ReadTimeout),
    ):
        client.get(f"{http_server.url}/drip")


# --------------------------------------------------------------------------- through the engine
@pytest.mark.django_db
def test_a_plan_aimed_at_a_refused_address_is_accepted_and_its_step_fails_once_unretried(
    http_server: HttpServer, settings: SettingsWrapper
) -> None:
    settings.HTTP_TOOL_ALLOWED_NETWORKS = []
    http_server.respond("/", json={})
    spec = factories.plan(steps=1, variables={"target": http_server.url})
    spec["agents"][0]["tasks"][0]["steps"][0].update(
        tool="http", params={"url": "${variables.target}/"}, retry={"max_attempts": 3}
    )
    run = services.run_create(organization=factories.org(), plan=spec)  # the validator accepts
    run_start(run_id=run.pk)
    assert control.pick_up(run.pk)
    step_id = Step.objects.get(run=run, name="step-0").pk

    assert executor.execute_step(step_id, worker="worker:test") == "failed"

    step = Step.objects.get(pk=step_id)
    assert (step.status, step.attempts) == ("failed", 1)
    assert step.error["code"] == "address_not_allowed"
    assert "127.0.0.1 is a loopback address" in step.error["message"]
    assert Run.objects.get(pk=run.pk).status == "failed"
    assert http_server.requests == []
