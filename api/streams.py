"""``GET /api/v1/runs/{id}/events/stream``: a run's events as they happen, as Server-Sent
Events (docs/api.md, "A run's event stream").

Each event goes out as the events list shows it (``EventOutput``), as ``id: <event id>``
and ``data: <JSON>`` with no ``event:`` field, so that a browser's ``onmessage`` gets it.
``Last-Event-ID`` (or ``?last_event_id=``) resumes strictly after that event. A comment
(``: keepalive``) goes out at once and every ``API_STREAM_HEARTBEAT_S``. The stream ends
once the run has ended and every event up to its end has been sent, or at the first
heartbeat after its API key was revoked or its organization suspended.

An organization has at most its quota `event_streams` open at once (docs/tenants.md):
each stream holds a lease (``eventstreams.StreamLease``), taken before the response
starts (one more: ``429 too_many_streams``), renewed at each heartbeat and released when
the server closes the response, whether or not it ever sent a frame.

A client must take each write within ``API_STREAM_SEND_TIMEOUT_S`` (``Leased``): one that
stops reading fills the connection's buffers, and the write blocks, where neither the
heartbeat (the lease's renewal, the key's check) nor the end of the run is ever reached.
Past the timeout the server drops the connection and frees the stream's place, so a
stalled client holds it, and outlives its key's revocation, for that long at most.

How it waits. PostgreSQL is the source of truth and Redis only says when to look
(``common.eventstreams``): the stream subscribes to its run's channel, registers the run
as watched, and reads the events after the last one it sent whenever it is woken, once
``eventstreams.REFRESH_S`` after it registered (a writer may not have seen the watch
before) and at every heartbeat. Between reads it holds no database connection (it gives
it back to the pool), and in the gevent web (config/gunicorn.py) it waits as a greenlet,
as a runner's held poll does: hundreds of open streams pin neither workers nor
PostgreSQL connections.

Why not simply "the events with an id above the last one sent". Ids come from a
sequence when an event is written (a row inserted, or a step's claim or completion kept
on its row: ``runs.selectors.run_history``), but transactions commit in their own order: a
recording that drew id 100 may commit after a claim that drew 101. A reader that sent
101 and moved its cursor past it would never send 100, and a client resuming after 101
would miss it too. So the stream sends an event only once no transaction can still
commit an event with a smaller id (``Horizon``): every id the sequence had handed out by
one look is final once every transaction that was running at the next look has ended
(PostgreSQL's snapshot says so: its ``xmin`` has passed that look's ``xmax``). The
events of a busy run therefore go out a look or two after their commit, in id order,
with no gap: what a client has seen is exactly the events list up to its last id.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import math
import time
from collections.abc import Generator, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar
from uuid import UUID

import gevent
import redis
from django.conf import settings
from django.db import DatabaseError, connection
from django.http import StreamingHttpResponse
from drf_spectacular.utils import extend_schema
from gevent import monkey
from rest_framework import serializers
from rest_framework.exceptions import ErrorDetail, ValidationError
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.renderers import BaseRenderer
from rest_framework.request import Request
from rest_framework.utils.encoders import JSONEncoder

from api.authentication import client_of
from api.base import ApiView
from api.serializers import EventOutput
from billing import quotas
from billing.selectors import key_refused
from common import eventstreams
from common.filters import MAX_BIGINT
from common.stores import broker_redis
from runs import selectors
from runs.models import Run
from runs.states import RUN_TERMINAL

logger = logging.getLogger(__name__)

KEEPALIVE = b": keepalive\n\n"
# Events read per query (and sent per write).
BATCH = 500
# The least time between two reads of one stream: a busy run's wake-ups (one per
# committed transaction) are taken together, so that a stream costs at most a few
# reads a second however fast its run goes.
MIN_LOOK_S = 0.2
# While events wait for the horizon, looks are spaced from MIN_LOOK_S up to this.
MAX_SETTLE_S = 2.0
# Without Redis (no wake-ups), a stream looks this often.
UNHEARD_LOOK_S = 5.0
# A writer may not know of a new stream's watch for eventstreams.REFRESH_S: what it
# wrote meanwhile, unannounced, is read by a look this long after the stream opened.
FIRST_RECHECK_S = eventstreams.REFRESH_S + 0.1
# Looks kept waiting for PostgreSQL's xmin (a long transaction holds it back); the
# newest is replaced beyond that, which only makes the newest wait longer.
MAX_PENDING_LOOKS = 32


# --------------------------------------------------------------------------- the horizon
@dataclass
class Horizon:
    """The largest event id below which nothing more can appear (``stable``).

    Each look (``observe``) reads, in one statement, PostgreSQL's snapshot (``xmin``: the
    oldest transaction still running; ``xmax``: the next transaction id to be handed
    out) and then the last id the events' sequence handed out (``allocated``). An id
    handed out by look k was drawn by a transaction that had its transaction id by look
    k+1 (it has one once it writes the row, microseconds after drawing the id, and looks
    are at least ``MIN_LOOK_S`` apart), so that id is below look k+1's ``xmax``; once a
    later look's ``xmin`` reaches that ``xmax``, all those transactions have ended, and
    every id up to look k's ``allocated`` is committed (visible) or gone for good.
    """

    stable: int = 0
    _unpaired: int | None = None  # ``allocated`` of the previous look
    _pending: list[tuple[int, int]] = field(default_factory=list)  # (allocated, xmax)

    def observe(self, xmin: int, xmax: int, allocated: int) -> int:
        if self._unpaired is not None:
            look = (self._unpaired, xmax)
            if self._pending and self._pending[-1][0] == look[0]:
                pass  # nothing handed out since: the older, sooner-ready look stands
            elif len(self._pending) >= MAX_PENDING_LOOKS:
                self._pending[-1] = look
            else:
                self._pending.append(look)
        self._unpaired = allocated
        # Both figures only grow from look to look: the looks ready form a prefix.
        while self._pending and self._pending[0][1] <= xmin:
            self.stable = max(self.stable, self._pending.pop(0)[0])
        return self.stable


# One statement per look: the snapshot first (the statement's own), then the sequence's
# last value (read as the statement runs, so after the snapshot was taken), the run's
# status as of that snapshot (every event committed before the run was seen ended has an
# id at most that value) and whether the run has events after the last one sent (its
# history: the event rows and the events kept on its steps' rows, whose ids come from the
# same sequence, drawn by the transaction that writes the step's row). Most looks (a
# heartbeat, a wake-up for events still beyond the horizon) end there: one probe of each
# of the history's (run, id) indexes, no rows read, nothing built in Python.
LOOK_SQL = """
SELECT pg_snapshot_xmin(s)::text::bigint,
       pg_snapshot_xmax(s)::text::bigint,
       COALESCE(pg_sequence_last_value(
           pg_get_serial_sequence('runs_runevent', 'id')::regclass), 0),
       (SELECT status FROM runs_run WHERE id = %(run)s),
       EXISTS (SELECT 1 FROM runs.run_history WHERE run_id = %(run)s AND id > %(after)s)
FROM pg_current_snapshot() AS s
"""


def _give_back_connection() -> None:
    """Return this greenlet's database connection to the pool (or close it) while the
    stream waits: hundreds of streams must not hold hundreds of connections."""
    if not connection.in_atomic_block:  # (a test's transaction stays open)
        connection.close()


def frame(event: dict[str, Any]) -> bytes:
    """One event as Server-Sent Events: its id, then its JSON on one ``data`` line, as
    DRF's JSONRenderer writes a body (compact, UTF-8, U+2028 and U+2029 escaped)."""
    data = json.dumps(
        event, cls=JSONEncoder, ensure_ascii=False, allow_nan=False, separators=(",", ":")
    )
    data = data.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")
    return f"id: {event['id']}\ndata: {data}\n\n".encode()


# --------------------------------------------------------------------------- wake-ups
class Wakeups:
    """The run's Redis channel, subscribed, and its registration as watched, renewed at
    each heartbeat. Without Redis the stream still runs, and looks every
    ``UNHEARD_LOOK_S``; it subscribes again at its next heartbeat once Redis is back.
    An outage slows a stream down, it ends none."""

    def __init__(self, run_id: UUID, heartbeat_s: float) -> None:
        self.run_id = run_id
        self.ttl_s = eventstreams.lapse_after(heartbeat_s)
        self.client = broker_redis(socket_connect_timeout=2, socket_timeout=5)
        self.pubsub: Any = None
        self.listening = False
        self._outage = False  # logged once per outage
        # Subscribed before the watch is registered: a writer that sees the watch
        # publishes to a channel that is listened to already.
        self._listen()
        self.renew()

    def _listen(self) -> None:
        self._close_pubsub()
        try:
            self.pubsub = self.client.pubsub(ignore_subscribe_messages=True)
            self.pubsub.subscribe(eventstreams.channel(self.run_id))
        except (redis.RedisError, OSError) as exc:
            self._deaf(exc)
            return
        self.listening = True

    def _deaf(self, exc: Exception) -> None:
        if not self._outage:
            logger.warning(
                "event stream of run %s without wake-ups (Redis: %s); looking every %ss",
                self.run_id,
                exc,
                UNHEARD_LOOK_S,
            )
        self._outage = True
        self.listening = False

    def renew(self) -> None:
        """At each heartbeat: the watch renewed (and the channel subscribed again after
        an outage)."""
        if not self.listening:
            self._listen()
        try:
            eventstreams.watch(self.run_id, self.ttl_s)
        except (redis.RedisError, OSError) as exc:
            self._deaf(exc)
            return
        if self._outage and self.listening:
            logger.warning("event stream of run %s has its wake-ups again", self.run_id)
            self._outage = False

    def wait(self, until: float) -> None:
        """Until a wake-up arrives or ``until`` (monotonic) has come."""
        while self.listening:
            left = until - time.monotonic()
            if left <= 0:
                return
            try:
                if self.pubsub.get_message(timeout=left) is not None:
                    return
            except (redis.RedisError, OSError) as exc:
                self._deaf(exc)
        left = until - time.monotonic()
        if left > 0:
            time.sleep(left)

    def drain(self) -> None:
        """Forget the wake-ups that arrived meanwhile: the next look covers them."""
        try:
            while self.listening and self.pubsub.get_message(timeout=0) is not None:
                pass
        except (redis.RedisError, OSError) as exc:
            self._deaf(exc)

    def _close_pubsub(self) -> None:
        if self.pubsub is not None:
            with contextlib.suppress(redis.RedisError, OSError):  # gone already
                self.pubsub.close()
            self.pubsub = None

    def close(self) -> None:
        self._close_pubsub()
        with contextlib.suppress(redis.RedisError, OSError):
            self.client.close()


# --------------------------------------------------------------------------- the stream
@dataclass
class EventStream:
    """The frames of one stream: events after ``after``, comments, until the run ends
    (or, at a heartbeat, the key ``api_key_id`` is found revoked or its organization
    suspended)."""

    run: Run
    after: int
    heartbeat_s: float
    api_key_id: Any = None
    lease: eventstreams.StreamLease | None = None
    horizon: Horizon = field(default_factory=Horizon)
    # The last id handed out when the run was first seen ended: the end, once sent.
    end_at: int | None = None

    def frames(self) -> Generator[bytes, None, None]:
        # Something at once: the response's headers leave with it, and the client knows
        # it is connected before anything happens.
        yield KEEPALIVE
        wakeups = Wakeups(self.run.pk, self.heartbeat_s)
        try:
            now = time.monotonic()
            heartbeat_at = now + self.heartbeat_s
            recheck_at: float | None = now + FIRST_RECHECK_S
            settle = MIN_LOOK_S
            stable = -1  # the horizon as of the look before (none yet)
            while True:
                looked_at = time.monotonic()
                waiting = False
                for chunk, held in self._look():
                    _give_back_connection()  # never held while a slow client reads
                    if chunk:
                        yield chunk
                    waiting = held
                moved, stable = self.horizon.stable != stable, self.horizon.stable
                if self._ended():
                    return
                due = heartbeat_at if recheck_at is None else min(heartbeat_at, recheck_at)
                if waiting or self.end_at is not None:
                    # Events (or the end) wait for the horizon: look again soon, less
                    # often while a long transaction holds PostgreSQL's xmin back.
                    settle = MIN_LOOK_S if moved else min(settle * 2, MAX_SETTLE_S)
                    due = min(due, looked_at + settle)
                if not wakeups.listening:
                    due = min(due, looked_at + UNHEARD_LOOK_S)
                wakeups.wait(due)
                # Wake-ups of a busy run come together: one look for all of them.
                pause = looked_at + MIN_LOOK_S - time.monotonic()
                if pause > 0:
                    time.sleep(pause)
                wakeups.drain()
                now = time.monotonic()
                if recheck_at is not None and now >= recheck_at:
                    recheck_at = None
                if now >= heartbeat_at:
                    if self._cut_off():
                        return
                    yield KEEPALIVE
                    wakeups.renew()
                    if self.lease is not None:
                        self.lease.renew()
                    heartbeat_at = now + self.heartbeat_s
        except DatabaseError as exc:
            # PostgreSQL went away: end the stream; the client resumes from its last id.
            logger.warning("event stream of run %s ended: database: %s", self.run.pk, exc)
        finally:
            wakeups.close()
            _give_back_connection()

    def _cut_off(self) -> bool:
        """Whether the key the stream was opened with may no longer read it (revoked, or
        its organization suspended): one read by primary keys, at each heartbeat."""
        if self.api_key_id is None:
            return False
        refused = key_refused(self.api_key_id)
        if refused:
            logger.info("event stream of run %s ended: %s", self.run.pk, refused)
        return bool(refused)

    def _ended(self) -> bool:
        return self.end_at is not None and self.horizon.stable >= self.end_at

    def _look(self) -> Iterator[tuple[bytes, bool]]:
        """One look: the horizon moved on, then the events up to it, a batch at a time
        (each batch's frames, and whether events beyond the horizon wait)."""
        with connection.cursor() as cursor:
            cursor.execute(LOOK_SQL, {"run": self.run.pk, "after": self.after})
            xmin, xmax, allocated, status, newer = cursor.fetchone()
        stable = self.horizon.observe(int(xmin), int(xmax), int(allocated))
        if self.end_at is None and status in RUN_TERMINAL:
            self.end_at = int(allocated)
        if not newer or stable <= self.after:
            yield b"", newer  # nothing new, or nothing new that is final yet
            return
        while True:
            rows = selectors.events_page(run=self.run, query={}, after=self.after, limit=BATCH)
            ready = [row for row in rows if row["id"] <= stable]
            held = len(ready) < len(rows)
            if ready:
                self.after = ready[-1]["id"]
            yield b"".join(frame(event) for event in EventOutput.rows(ready)), held
            if held or len(rows) < BATCH:
                return


# --------------------------------------------------------------------------- the view
class StalledClient(ConnectionResetError):
    """The client took no write for ``API_STREAM_SEND_TIMEOUT_S``: the server gives its
    connection up. A reset, to gunicorn: it closes the connection without writing more
    (an error answer would block on the same full buffers) and logs it at debug level;
    ``Leased`` logs the drop itself."""


def write_deadline(seconds: float) -> gevent.Timeout | None:
    """A timer that breaks the current greenlet out of whatever write it is blocked in,
    ``seconds`` from now (``StalledClient``); None outside the gevent web, whose writes are
    not cooperative (the development server, the tests' live server)."""
    if not monkey.is_module_patched("socket"):
        return None
    stalled = StalledClient(errno.ECONNRESET, f"no write taken for {seconds:g} s")
    return gevent.Timeout.start_new(seconds, stalled)


class Leased:
    """A stream's frames, each to be taken by the client within ``send_timeout_s``, and
    its lease released when the server closes the response (WSGI's ``close``, which
    Django passes on to its content): after the last frame, a client gone or dropped, or
    never started at all (a generator never started runs no ``finally``).

    The write is the server's (gunicorn's worker writes each frame while this generator
    waits at its ``yield``), so the deadline is a gevent timer armed before each frame is
    handed over and cancelled when the next one is asked for: it fires only while the
    write of that frame is still blocked."""

    def __init__(
        self,
        frames: Generator[bytes, None, None],
        lease: eventstreams.StreamLease,
        *,
        send_timeout_s: float,
        name: str,
    ) -> None:
        self.frames = frames
        self.lease = lease
        self.send_timeout_s = send_timeout_s
        self.name = name
        self._sending = self._send()

    def __iter__(self) -> Iterator[bytes]:
        return self._sending

    def _send(self) -> Generator[bytes, None, None]:
        for chunk in self.frames:
            deadline = write_deadline(self.send_timeout_s)
            try:
                yield chunk
            except GeneratorExit:
                if deadline is not None and not deadline.pending:  # it fired
                    logger.warning(
                        "%s dropped: the client took no write for %g s",
                        self.name,
                        self.send_timeout_s,
                    )
                raise
            finally:
                if deadline is not None:
                    deadline.close()

    def close(self) -> None:
        try:
            self._sending.close()
            self.frames.close()
        finally:
            self.lease.release()


class StreamQuery(serializers.Serializer[Any]):
    last_event_id = serializers.IntegerField(
        required=False,
        min_value=0,
        max_value=MAX_BIGINT,
        help_text="Resume after this event id (for clients that cannot set Last-Event-ID).",
    )


class JsonWhateverIsAccepted(DefaultContentNegotiation):
    """Errors are JSON whatever ``Accept`` says (``text/event-stream`` included): a client
    of the stream gets the API's 404 or 400, not a 406 about the error's format."""

    def select_renderer(
        self, request: Request, renderers: Iterable[BaseRenderer], format_suffix: str | None = None
    ) -> tuple[BaseRenderer, str]:
        renderer = next(iter(renderers))  # the API's one: JSON
        return renderer, str(renderer.media_type)


def last_event_id(request: Request, query: dict[str, Any]) -> int:
    """Where to resume: the ``Last-Event-ID`` header (what a browser sends when it
    reconnects, to the URL it first opened), else ``?last_event_id=``, else 0."""
    header = request.headers.get("Last-Event-ID")
    if header is None:
        return int(query.get("last_event_id", 0))
    value = header.strip()
    if not value.isascii() or not value.isdigit() or int(value) > MAX_BIGINT:
        raise ValidationError(
            {
                "Last-Event-ID": [
                    ErrorDetail("must be an event id: a whole number, 0 or more", code="invalid")
                ]
            }
        )
    return int(value)


class RunEventsStreamApi(ApiView):
    queries: ClassVar[dict[str, type[serializers.Serializer[Any]]]] = {"get": StreamQuery}
    content_negotiation_class = JsonWhateverIsAccepted

    # Not in the OpenAPI schema: OpenAPI 3.0 cannot describe a stream's events, and its
    # tools (Swagger UI's "Try it out", schemathesis) read a response to its end, which
    # a running run's stream has not. docs/api.md describes it.
    @extend_schema(exclude=True)
    def get(self, request: Request, run_id: UUID) -> StreamingHttpResponse:
        """The run's events after ``Last-Event-ID`` as they happen, until it has ended."""
        client = client_of(request)
        organization = client.organization
        run = selectors.run_get(organization=organization, run_id=run_id)
        after = last_event_id(request, self.query)
        heartbeat_s = settings.API_STREAM_HEARTBEAT_S
        send_timeout_s = settings.API_STREAM_SEND_TIMEOUT_S
        # Renewed at each heartbeat, which a write may hold up by the send timeout.
        ttl_s = eventstreams.lapse_after(heartbeat_s) + send_timeout_s
        lease = eventstreams.StreamLease(organization.pk, ttl_s=ttl_s)
        limit = quotas.quota_of(organization, quotas.EVENT_STREAMS)
        if not lease.take(limit):
            # A place frees when a stream closes, or at the latest when the lease of one
            # whose web process died lapses.
            raise quotas.TooManyStreams(limit, retry_after=max(1, math.ceil(heartbeat_s)))
        stream = EventStream(
            run=run, after=after, heartbeat_s=heartbeat_s, api_key_id=client.api_key.pk, lease=lease
        )
        content = Leased(
            stream.frames(),
            lease,
            send_timeout_s=send_timeout_s,
            name=f"event stream of run {run.pk}",
        )
        response = StreamingHttpResponse(content, content_type="text/event-stream")
        response["Cache-Control"] = "no-cache"
        response["X-Accel-Buffering"] = "no"  # nginx: pass each event on at once
        return response
