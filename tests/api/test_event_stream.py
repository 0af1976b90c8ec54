"""A run's event stream (``GET /api/v1/runs/{id}/events/stream``) over real HTTP:
pytest-django's live server, the real PostgreSQL and Redis, and for runs that execute the
session's real Celery worker. The order and contents are held to the events list
(``GET .../events``); resumption, the end, errors, heartbeats and wake-ups each have a test.
The stream in the gevent web, 200 at a time: tests/integration/test_event_streams.py."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import psycopg
import pytest
import redis
from django.db import connection, transaction
from prometheus_client.parser import text_string_to_metric_families

from api import streams
from api.streams import EventStream, Horizon
from billing.models import Organization
from billing.services import api_key_create
from common import eventstreams
from runs import services
from runs.engine.start import run_start
from runs.models import Run, Step
from runs.selectors import run_history
from runs.transitions import record_event
from tests import factories
from tests.api import states
from tests.api.sse import Block, blocks, open_stream, read_all, stream_url, subscribers
from tests.support import free_port, wait_until
from tests.tenants import LiveTenant

pytestmark = pytest.mark.django_db(transaction=True)


def listed(live: LiveTenant, run_id: object) -> list[dict[str, Any]]:
    """Every event of the run as the events list shows it (every cursor page)."""
    found: list[dict[str, Any]] = []
    url: str | None = f"{live.url}/api/v1/runs/{run_id}/events?page_size=500"
    while url:
        page = httpx.get(url, headers=live.auth, timeout=10).json()
        found += page["results"]
        url = page["next"]
    return found


def sleeps(*seconds: float) -> dict[str, Any]:
    plan = factories.plan(name="sleeps", steps=0)
    plan["agents"][0]["tasks"][0]["steps"] = [
        {"name": f"nap{n}", "tool": "sleep", "params": {"seconds": s}}
        for n, s in enumerate(seconds)
    ]
    return plan


def events_of(received: Iterator[Block], count: int) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    for block in received:
        if not block.keepalive:
            found.append(block.data)
            if len(found) == count:
                break
    return found


def last_id(run: Run) -> str:
    """The id of the run's latest event (its creation's, for a run just created)."""
    return str(run_history(run).latest("id").pk)


def finished_run(organization: Organization) -> Run:
    """A run that ended without a worker: started (its reservation), then cancelled."""
    run = factories.run(organization)
    run_start(run_id=run.pk)
    return services.run_cancel(run_id=run.pk, reason="done with it")


# --------------------------------------------------------------------------- what it sends
@pytest.mark.usefixtures("celery_worker")
def test_a_runs_events_arrive_in_id_order_exactly_as_listed_and_the_stream_ends_with_it(
    live: LiveTenant,
) -> None:
    run = services.run_create(organization=live.organization, plan=factories.fan(24))

    with httpx.Client(timeout=60) as http, open_stream(http, live.url, run.pk, live.key) as r:
        assert r.status_code == 200
        assert r.headers["content-type"] == "text/event-stream"
        assert r.headers["cache-control"] == "no-cache"
        received = blocks(r.iter_lines())
        assert next(received).keepalive  # at once, before anything happens
        run_start(run_id=run.pk)
        streamed = [block.data for block in received if not block.keepalive]

    # The loop above ended because the server closed the stream: the run had ended.
    assert Run.objects.get(pk=run.pk).status == "completed"
    assert streamed == listed(live, run.pk)
    ids = [event["id"] for event in streamed]
    assert ids == sorted(set(ids))
    run_states = [e["to_status"] for e in streamed if e["entity"] == "run" and e["to_status"]]
    assert run_states == ["pending", "running", "completed"]
    assert sum(e["entity"] == "step" and e["to_status"] == "completed" for e in streamed) == 25


@pytest.mark.usefixtures("celery_worker")
def test_a_stream_resumed_by_last_event_id_goes_on_with_no_gap_and_no_repeat(
    live: LiveTenant,
) -> None:
    run = services.run_create(organization=live.organization, plan=sleeps(0.05, 0.05, 0.05, 0.05))

    with httpx.Client(timeout=60) as http, open_stream(http, live.url, run.pk, live.key) as r:
        received = blocks(r.iter_lines())
        run_start(run_id=run.pk)
        first = events_of(received, 3)
    # The connection is gone; the client comes back with the last id it saw.
    rest = read_all(live.url, run.pk, live.key, headers={"Last-Event-ID": str(first[-1]["id"])})

    assert first + rest == listed(live, run.pk)
    ended = [e for e in rest if e["entity"] == "run" and e["to_status"] == "completed"]
    assert len(ended) == 1


@pytest.mark.usefixtures("celery_worker")
def test_a_cancelled_run_ends_its_stream_after_its_last_event(live: LiveTenant) -> None:
    run = services.run_create(organization=live.organization, plan=sleeps(60))

    with httpx.Client(timeout=60) as http, open_stream(http, live.url, run.pk, live.key) as r:
        received = blocks(r.iter_lines())
        run_start(run_id=run.pk)
        for block in received:  # until the step runs
            if not block.keepalive and block.data["path"] == "agent-0.task-0.nap0":
                assert block.data["to_status"] == "running"
                break
        cancelled = httpx.post(f"{live.url}/api/v1/runs/{run.pk}/cancel", headers=live.auth)
        rest = [block.data for block in received if not block.keepalive]

    assert cancelled.status_code == 200
    run_events = [e for e in rest if e["entity"] == "run" and e["kind"] == "transition"]
    assert run_events[-1]["to_status"] == "cancelled"
    assert [e["id"] for e in listed(live, run.pk)][-len(rest) :] == [e["id"] for e in rest]


def test_a_finished_runs_stream_sends_what_follows_last_event_id_and_closes(
    live: LiveTenant,
) -> None:
    run = finished_run(live.organization)
    events = listed(live, run.pk)
    ids = [str(event["id"]) for event in events]
    assert len(events) >= 3

    everything = read_all(live.url, run.pk, live.key)
    after_first = read_all(live.url, run.pk, live.key, headers={"Last-Event-ID": ids[0]})
    by_query = read_all(live.url, run.pk, live.key, params={"last_event_id": ids[1]})
    # A browser reconnects to the URL it opened, with the header of the last event seen.
    header_wins = read_all(
        live.url,
        run.pk,
        live.key,
        params={"last_event_id": ids[0]},
        headers={"Last-Event-ID": ids[2]},
    )
    at_the_end = read_all(live.url, run.pk, live.key, headers={"Last-Event-ID": ids[-1]})

    assert everything == events
    assert after_first == events[1:]
    assert by_query == events[2:]
    assert header_wins == events[3:]
    assert at_the_end == []


def test_without_redis_a_stream_still_opens_and_sends_what_postgresql_holds(
    live: LiveTenant, settings: Any
) -> None:
    run = finished_run(live.organization)
    events = listed(live, run.pk)
    settings.CELERY_BROKER_URL = f"redis://127.0.0.1:{free_port()}/0"  # nobody there

    assert read_all(live.url, run.pk, live.key) == events


def test_a_read_key_may_stream_as_it_may_list_events(live: LiveTenant) -> None:
    run = finished_run(live.organization)
    _, reader = api_key_create(organization=live.organization, name="dash", scope="read")

    assert read_all(live.url, run.pk, reader) == listed(live, run.pk)


# --------------------------------------------------------------------------- errors
NOT_FOUND = {"code": "not_found", "message": "not found", "details": None}


def test_another_organizations_run_is_404_in_json_whatever_accept_says(live: LiveTenant) -> None:
    theirs = factories.run(factories.org())
    unknown = "00000000-0000-4000-8000-000000000000"

    for run_id in (theirs.pk, unknown):
        for accept in ("text/event-stream", "application/json", "*/*"):
            response = httpx.get(
                stream_url(live.url, run_id), headers={**live.auth, "Accept": accept}
            )

            assert response.status_code == 404, (accept, response.text)
            assert response.headers["content-type"] == "application/json"
            assert response.json() == NOT_FOUND


def test_without_a_key_it_is_401_and_with_a_runner_key_403(live: LiveTenant) -> None:
    run = factories.run(live.organization)
    _, runner_key = api_key_create(organization=live.organization, name="r", scope="runner")
    accept = {"Accept": "text/event-stream"}

    anonymous = httpx.get(stream_url(live.url, run.pk), headers=accept)
    runner = httpx.get(
        stream_url(live.url, run.pk), headers={**accept, "Authorization": f"Bearer {runner_key}"}
    )

    assert anonymous.status_code == 401
    assert anonymous.json()["code"] == "not_authenticated"
    assert anonymous.headers["www-authenticate"] == 'Bearer realm="api"'
    assert runner.status_code == 403
    assert runner.json()["code"] == "insufficient_scope"


@pytest.mark.parametrize("value", ["abc", "-1", "1.5", "0x10", "", "1 2", "9" * 30])
def test_a_malformed_last_event_id_is_400_naming_it(live: LiveTenant, value: str) -> None:
    run = factories.run(live.organization)

    response = httpx.get(
        stream_url(live.url, run.pk),
        headers={**live.auth, "Accept": "text/event-stream", "Last-Event-ID": value},
    )

    assert response.status_code == 400
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert body["code"] == "invalid_request"
    assert body["details"] == [
        {
            "path": "Last-Event-ID",
            "message": "must be an event id: a whole number, 0 or more",
            "code": "invalid",
        }
    ]


@pytest.mark.parametrize(
    ("query", "path"),
    [({"last_event_id": "x"}, "last_event_id"), ({"last_event_id": "-3"}, "last_event_id"),
     ({"after": "3"}, "after")],
)  # fmt: skip
def test_a_malformed_or_unknown_query_parameter_is_400_naming_it(
    live: LiveTenant, query: dict[str, str], path: str
) -> None:
    run = factories.run(live.organization)

    response = httpx.get(
        stream_url(live.url, run.pk),
        params=query,
        headers={**live.auth, "Accept": "text/event-stream"},
    )

    assert response.status_code == 400
    assert response.json()["code"] == "invalid_request"
    assert [problem["path"] for problem in response.json()["details"]] == [path]


# --------------------------------------------------------------------------- how it waits
def test_a_quiet_stream_sends_keepalives_and_keeps_its_run_watched(
    live: LiveTenant, settings: Any, broker: redis.Redis[bytes]
) -> None:
    settings.API_STREAM_HEARTBEAT_S = 0.2
    run = factories.run(live.organization)  # created: nothing happens to it
    after = {"Last-Event-ID": last_id(run)}

    with (
        httpx.Client(timeout=10) as http,
        open_stream(http, live.url, run.pk, live.key, headers=after) as r,
    ):
        received = blocks(r.iter_lines())
        heard = [next(received) for _ in range(4)]
        expiry = broker.zscore(eventstreams.WATCHED, str(run.pk))
    # The server's side of the stream ends when a keepalive meets the closed connection;
    # until then it may still read the run, racing the teardown's flush (a deadlock seen
    # once in make test).
    channel = eventstreams.channel(run.pk)
    wait_until(lambda: subscribers(broker, channel) == 0, what="the stream to end on the server")

    assert all(block.keepalive for block in heard)
    assert expiry is not None


def test_open_streams_and_the_runs_they_follow_are_in_the_metrics(
    live: LiveTenant, settings: Any, broker: redis.Redis[bytes]
) -> None:
    settings.METRICS_TOKEN = "scrape-me"
    settings.API_STREAM_HEARTBEAT_S = 0.2  # the server sees the streams closed soon after
    run = factories.run(live.organization)
    channel = eventstreams.channel(run.pk)

    def scrape() -> dict[str, float]:
        response = httpx.get(f"{live.url}/metrics", headers={"Authorization": "Bearer scrape-me"})
        families = text_string_to_metric_families(response.text)
        return {sample.name: sample.value for family in families for sample in family.samples}

    with (
        httpx.Client(timeout=10) as http,
        open_stream(http, live.url, run.pk, live.key) as first,
        open_stream(http, live.url, run.pk, live.key) as second,
    ):
        assert (first.status_code, second.status_code) == (200, 200)
        wait_until(lambda: subscribers(broker, channel) == 2, what="both streams to subscribe")
        held = scrape()
    # As in the keepalive test: each stream's server side ends at its next keepalive;
    # until then it may read the run, racing the teardown's flush (a deadlock seen in a
    # fresh clone's make test).
    wait_until(lambda: subscribers(broker, channel) == 0, what="the streams to end on the server")

    assert held["orchestrator_event_streams"] >= 2
    assert held["orchestrator_event_streams_watched_runs"] >= 1


def test_an_event_reaches_a_stream_by_its_wakeup_not_by_a_timer(
    live: LiveTenant, settings: Any, broker: redis.Redis[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Heartbeat and first re-check an hour away: only a Redis wake-up brings events in.
    settings.API_STREAM_HEARTBEAT_S = 300
    monkeypatch.setattr(streams, "FIRST_RECHECK_S", 3600)
    run = factories.run(live.organization)
    channel = eventstreams.channel(run.pk)
    after = {"Last-Event-ID": last_id(run)}

    with (
        httpx.Client(timeout=20) as http,
        open_stream(http, live.url, run.pk, live.key, headers=after) as r,
    ):
        received = blocks(r.iter_lines())
        assert next(received).keepalive
        wait_until(
            lambda: (
                broker.zscore(eventstreams.WATCHED, str(run.pk)) is not None
                and subscribers(broker, channel) >= 1
            ),
            what="the stream to subscribe and register its run",
        )
        # This process as a writer that has just read the watched runs.
        monkeypatch.setattr(eventstreams, "_copy", eventstreams._Copy())
        with transaction.atomic():
            notes = [record_event(run, "operator", message=f"note {n}").pk for n in range(3)]
        first = events_of(received, 3)
        # Once those are sent the stream waits on Redis only: a later event too.
        late = record_event(run, "operator", message="later").pk  # autocommit: published at once
        second = events_of(received, 1)

    assert [event["id"] for event in first] == notes
    assert [event["id"] for event in second] == [late]


def test_an_event_its_writer_did_not_announce_is_read_soon_after_the_stream_opened(
    live: LiveTenant, settings: Any, broker: redis.Redis[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The writer read the watched runs just before this stream registered: it announces
    # nothing for a while. The stream reads PostgreSQL again shortly after it opened.
    settings.API_STREAM_HEARTBEAT_S = 300
    run = factories.run(live.organization)
    stale = eventstreams._Copy(runs=frozenset(), refresh_at=time.monotonic() + 3600)
    monkeypatch.setattr(eventstreams, "_copy", stale)
    after = {"Last-Event-ID": last_id(run)}

    with (
        httpx.Client(timeout=10) as http,
        open_stream(http, live.url, run.pk, live.key, headers=after) as r,
    ):
        received = blocks(r.iter_lines())
        assert next(received).keepalive
        wait_until(
            lambda: broker.zscore(eventstreams.WATCHED, str(run.pk)) is not None,
            what="the stream to register its run",
        )
        unannounced = record_event(run, "operator", message="nobody was told").pk
        got = events_of(received, 1)

    assert [event["id"] for event in got] == [unannounced]


def test_an_event_committed_out_of_id_order_waits_for_the_one_before_it(
    live: LiveTenant,
) -> None:
    # A transaction draws event id N and stays open; another draws N+1 and commits. The
    # stream must not send N+1 (a client resuming after it would never get N) until N is
    # committed, and then sends N, N+1.
    run = factories.run(live.organization)
    stream = EventStream(run=run, after=0, heartbeat_s=15)
    settings_dict = connection.settings_dict
    with psycopg.connect(
        host=settings_dict["HOST"],
        port=settings_dict["PORT"],
        dbname=settings_dict["NAME"],
        user=settings_dict["USER"],
        password=settings_dict["PASSWORD"] or None,
    ) as other:
        with other.cursor() as cursor:
            cursor.execute(
                "INSERT INTO runs_runevent (run_id, attempt_number, entity, entity_id, kind,"
                " from_status, to_status, actor, message, payload, created_at)"
                " VALUES (%s, 0, 'run', %s, 'operator', '', '', 'test', 'first drawn', '{}', now())"
                " RETURNING id",
                [run.pk, str(run.pk)],
            )
            row = cursor.fetchone()
            assert row is not None
            earlier = row[0]
        later = record_event(run, "operator", message="drawn second, committed first").pk
        assert later > earlier
        seen = set(run_history(run).values_list("pk", flat=True))
        assert later in seen
        assert earlier not in seen
        created = set(seen) - {later}  # the run's own creation event(s)

        while_open = [look(stream) for _ in range(3)]
        other.commit()

    def caught_up() -> list[int] | None:
        sent = look(stream)
        return sent or None

    sent = wait_until(caught_up, what="the horizon to pass both events")
    # Nothing while the earlier id was uncommitted (not even the run's creation: the
    # horizon had not passed the open transaction), then everything, in id order.
    assert while_open == [[], [], []]
    assert sent == sorted(created | {earlier, later})


def test_a_claim_kept_on_its_steps_row_committed_out_of_id_order_waits_for_it_too(
    live: LiveTenant,
) -> None:
    # A claim draws its event's id and keeps it on the step's row (no event row), in a
    # transaction that stays open; an event drawn after it commits first. The stream
    # sends neither until the claim commits, then both, in id order, the claim as the
    # events list shows it.
    run = states.running(live.organization)
    stream = EventStream(run=run, after=int(last_id(run)), heartbeat_s=15)
    settings_dict = connection.settings_dict
    with psycopg.connect(
        host=settings_dict["HOST"],
        port=settings_dict["PORT"],
        dbname=settings_dict["NAME"],
        user=settings_dict["USER"],
        password=settings_dict["PASSWORD"] or None,
    ) as other:
        with other.cursor() as cursor:
            cursor.execute(
                "SELECT id FROM runs.step_claim(NULL, %s, 'worker:other', 'task', 60)",
                [run.pk],
            )
            assert cursor.fetchone() is not None
        later = record_event(run, "operator", message="drawn after the claim, committed first").pk
        claims = Step.objects.filter(run=run, claim_event__isnull=False)
        assert not claims.exists()  # not committed yet

        while_open = [look(stream) for _ in range(3)]
        other.commit()

    claim = claims.get().claim_event
    assert claim is not None
    assert claim < later
    sent = wait_until(lambda: look(stream) or None, what="the horizon to pass both events")
    assert while_open == [[], [], []]
    assert sent == [claim, later]
    assert [event["id"] for event in listed(live, run.pk)][-2:] == sent


def look(stream: EventStream) -> list[int]:
    """One look of ``stream``, in this process: the ids it would send."""
    ids: list[int] = []
    for chunk, _ in stream._look():
        for line in chunk.decode().splitlines():
            if line.startswith("data: "):
                ids.append(json.loads(line[6:])["id"])
    return ids


def test_the_horizon_moves_only_when_every_transaction_of_an_earlier_look_ended() -> None:
    horizon = Horizon()

    # Look 1: ids up to 10 handed out. Nothing is known final yet.
    assert horizon.observe(xmin=100, xmax=105, allocated=10) == 0
    # Look 2: transactions 100..104 may hold ids up to 10; xmin 100 < 107: not yet.
    assert horizon.observe(xmin=100, xmax=107, allocated=12) == 0
    # Look 3: everything below 107 has ended: ids up to 10 are final, 12 not yet.
    assert horizon.observe(xmin=107, xmax=109, allocated=12) == 10
    # Look 4: 12 was paired with 109, passed now; nothing new handed out meanwhile.
    assert horizon.observe(xmin=110, xmax=110, allocated=12) == 12
    assert horizon.observe(xmin=111, xmax=111, allocated=12) == 12
