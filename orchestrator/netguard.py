"""Where the `http` tool may connect: public addresses only, unless an operator says more.

A plan is written by a tenant, so its URLs are hostile input: without a guard a plan
could read the cloud metadata service (169.254.169.254), the worker's own PostgreSQL and
Redis on loopback, or anything on the private network. Every connection the tool opens,
redirects included, goes through ``GuardedBackend``: the host name is resolved here, every
address it resolves to is classified, and the socket connects to one of the addresses
that were checked, never to the name again, so DNS rebinding (a name that answers a
public address to the check and a private one to the connection) has no gap to use.

Because the check is on resolved addresses, every notation of an address is covered:
decimal integers (``2130706433``), short forms (``127.1``), hex and octal, IPv4-mapped
and 6to4/Teredo/NAT64 IPv6 forms all resolve to the address they stand for.

``HTTP_TOOL_ALLOWED_NETWORKS`` (CIDRs, empty by default) lifts the refusal for networks
an operator trusts, e.g. an internal API on 10.1.2.0/24. The run webhooks, the on-call
webhook and poll steps connect through the same guard and the same setting; a refusal
names which of them was refused.

A ``deadline`` (``guarded_client(deadline=...)``, a ``time.monotonic()`` instant) bounds
the whole exchange, not each step of it: the name's resolution, each address's connect,
TLS, and every read and write of the request and its answer get only the time left, so a
receiver that drips its headers a byte at a time is cut at the deadline like a silent one
(httpx's own timeouts bound each read alone). Every caller sends with one, through
``orchestrator.outbound``, which also bounds how much of an answer is decoded.
"""

from __future__ import annotations

import concurrent.futures
import functools
import ipaddress
import socket
import ssl
import time
from collections.abc import Iterable, Sequence
from typing import Any

import certifi
import httpcore
import httpx

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

SHARED = ipaddress.ip_network("100.64.0.0/10")  # carrier-grade NAT (RFC 6598)
NAT64 = ipaddress.ip_network("64:ff9b::/96")  # IPv4 embedded in the last 32 bits


# What a refusal says was refused, by who connects (``guarded_client``'s ``refused``).
HTTP_TOOL = "the http tool may not connect to it"
WEBHOOK = "a webhook may not be sent to it"
ONCALL_WEBHOOK = "the on-call webhook may not be sent to it"
POLL = "a poll step may not connect to it"


class AddressNotAllowed(Exception):
    """A connection the guard refused: ``host`` resolved to ``address`` of class ``kind``;
    ``refused`` says what may not happen (the http tool's connection, a webhook...)."""

    def __init__(self, host: str, address: IPAddress, kind: str, refused: str = HTTP_TOOL) -> None:
        self.host, self.address, self.kind = host, address, kind
        shown = host if host == str(address) else f"{host} ({address})"
        super().__init__(
            f"{shown} is a {kind} address; {refused} "
            "(HTTP_TOOL_ALLOWED_NETWORKS lists the networks an operator allows)"
        )


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address stands for (mapped, 6to4, Teredo, NAT64)."""
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip.teredo is not None:
        return ip.teredo[1]  # (server, client): the client is where traffic goes
    if ip in NAT64:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def classify(ip: IPAddress) -> str | None:
    """The class of a refused address ("loopback", "private"...), or None if public."""
    if isinstance(ip, ipaddress.IPv6Address):
        embedded = _embedded_ipv4(ip)
        if embedded is not None:
            return classify(embedded)
        if ip.is_site_local:
            return "site-local"
    if ip.is_unspecified:
        return "unspecified"
    if ip.is_loopback:
        return "loopback"
    if ip.is_link_local:
        return "link-local"
    if ip.is_multicast:
        return "multicast"
    if isinstance(ip, ipaddress.IPv4Address) and ip in SHARED:
        return "shared (carrier-grade NAT)"
    if ip.is_reserved:  # before private: Python files 240.0.0.0/4 under both
        return "reserved"
    if ip.is_private:
        return "private"
    if not ip.is_global:
        return "non-global"
    return None


@functools.lru_cache(maxsize=8)
def parse_networks(cidrs: tuple[str, ...]) -> tuple[Network, ...]:
    return tuple(ipaddress.ip_network(cidr.strip(), strict=False) for cidr in cidrs)


def check_address(
    host: str, ip: IPAddress, allowed: Sequence[Network] = (), refused: str = HTTP_TOOL
) -> None:
    """Raise AddressNotAllowed unless ``ip`` is public or inside an allowed network."""
    kind = classify(ip)
    if kind is None:
        return
    candidates = [ip]
    if isinstance(ip, ipaddress.IPv6Address):
        embedded = _embedded_ipv4(ip)
        if embedded is not None:
            candidates.append(embedded)
    if any(candidate in network for candidate in candidates for network in allowed):
        return
    raise AddressNotAllowed(host, ip, kind, refused)


def resolve(host: str, port: int) -> list[IPAddress]:
    """Every address ``host`` resolves to for TCP, in the resolver's order, once each."""
    found: list[IPAddress] = []
    for *_, sockaddr in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM):
        address = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])  # drop a scope id
        if address not in found:
            found.append(address)
    return found


# Name look-ups under a deadline run here, so that the caller can stop waiting for one
# (getaddrinfo itself cannot be interrupted: a look-up left behind ends with the
# resolver's own timeout, holding one of these threads until then).
_RESOLVERS = concurrent.futures.ThreadPoolExecutor(max_workers=32, thread_name_prefix="resolve")


def resolve_within(host: str, port: int, seconds: float | None) -> list[IPAddress]:
    """``resolve``, given up after ``seconds`` (None: no bound) with ``TimeoutError``."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        pass
    else:
        seconds = None  # an address is its own answer: no look-up to wait for
    if seconds is None:
        return resolve(host, port)
    future = _RESOLVERS.submit(resolve, host, port)
    try:
        return future.result(timeout=max(seconds, 0.0))
    except concurrent.futures.TimeoutError:
        future.cancel()
        raise TimeoutError(f"resolving {host} took longer than the time left") from None


def checked_addresses(
    host: str,
    port: int,
    allowed: Sequence[Network],
    refused: str = HTTP_TOOL,
    within: float | None = None,
) -> list[IPAddress]:
    """Resolve ``host`` (within ``within`` seconds, when given) and check every answer:
    one refused address refuses the name."""
    addresses = resolve_within(host, port, within)
    for address in addresses:
        check_address(host, address, allowed, refused)
    return addresses


def _left(
    deadline: float | None, timeout: float | None, timed_out: type[Exception]
) -> float | None:
    """The smaller of ``timeout`` and the time left before ``deadline``; ``timed_out``
    raised once the deadline has passed."""
    if deadline is None:
        return timeout
    left = deadline - time.monotonic()
    if left <= 0:
        raise timed_out("the deadline passed")
    return left if timeout is None else min(timeout, left)


class DeadlineStream(httpcore.NetworkStream):
    """A connection whose every read, write and TLS handshake gets only the time left
    before ``deadline``: the whole exchange is bounded, however slowly bytes come."""

    def __init__(self, stream: httpcore.NetworkStream, deadline: float) -> None:
        self.stream, self.deadline = stream, deadline

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self.stream.read(max_bytes, _left(self.deadline, timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self.stream.write(buffer, _left(self.deadline, timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self.stream.close()

    def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.NetworkStream:
        left = _left(self.deadline, timeout, httpcore.ConnectTimeout)
        return DeadlineStream(
            self.stream.start_tls(ssl_context, server_hostname, left), self.deadline
        )

    def get_extra_info(self, info: str) -> Any:
        return self.stream.get_extra_info(info)


class GuardedBackend(httpcore.SyncBackend):
    """httpcore's socket backend, connecting only to addresses the guard checked (all of
    it before ``deadline``, a ``time.monotonic()`` instant, when one is given)."""

    def __init__(
        self, allowed: Sequence[Network], refused: str = HTTP_TOOL, deadline: float | None = None
    ) -> None:
        self.allowed = tuple(allowed)
        self.refused = refused
        self.deadline = deadline

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        try:
            # Only a deadline bounds the look-up (without one, the resolver's own timeout).
            within = _left(self.deadline, None, httpcore.ConnectTimeout)
            addresses = checked_addresses(host, port, self.allowed, self.refused, within)
        except socket.gaierror as exc:
            raise httpcore.ConnectError(f"cannot resolve {host}: {exc}") from exc
        except TimeoutError as exc:
            raise httpcore.ConnectTimeout(str(exc)) from exc
        last: Exception = httpcore.ConnectError(f"{host} resolved to no address")
        for address in addresses:
            try:
                # The checked address itself: a second lookup could answer differently.
                stream = super().connect_tcp(
                    str(address),
                    port,
                    _left(self.deadline, timeout, httpcore.ConnectTimeout),
                    local_address,
                    socket_options,
                )
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                last = exc
                continue
            return stream if self.deadline is None else DeadlineStream(stream, self.deadline)
        raise last


class GuardedTransport(httpx.HTTPTransport):
    """An httpx transport whose every connection goes through ``GuardedBackend``.

    TLS still verifies the certificate against the URL's host name (httpcore passes the
    request's host as server_hostname), only the TCP connection targets the address.
    """

    def __init__(
        self, allowed: Sequence[Network], refused: str = HTTP_TOOL, deadline: float | None = None
    ) -> None:
        super().__init__()
        self._pool = httpcore.ConnectionPool(
            ssl_context=ssl.create_default_context(cafile=certifi.where()),
            network_backend=GuardedBackend(allowed, refused, deadline),
        )


def guarded_client(
    allowed_cidrs: Iterable[str],
    *,
    refused: str = HTTP_TOOL,
    deadline: float | None = None,
    **options: Any,
) -> httpx.Client:
    """An httpx client for tenant-supplied URLs; ``refused`` is what a refusal says may
    not happen (``HTTP_TOOL``, ``WEBHOOK``...); ``deadline`` (a ``time.monotonic()``
    instant) bounds everything it does, from the name's look-up to the answer's last
    byte. No proxy from the environment: a proxy would make the connection for us, out
    of the guard's sight."""
    allowed = parse_networks(tuple(allowed_cidrs))
    transport = GuardedTransport(allowed, refused, deadline)
    return httpx.Client(transport=transport, trust_env=False, **options)
