"""Hundreds of event streams held by one gunicorn gevent web process (config/gunicorn.py),
with the real Celery worker executing the run they follow: the web still answers, the
streams hold no database connection while they wait, and every stream receives the
run's events, exactly as listed, and ends with it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
import redis
from django.db import connection

from billing.services import api_key_create
from common import eventstreams
from runs import services
from tests import factories
from tests.api.sse import blocks, open_stream, subscribers
from tests.integration.web_support import gunicorn
from tests.support import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("celery_worker")]

STREAMS = 200
POOL = 10  # DATABASE_POOL_SIZE of the web process (config/gunicorn.py's default)


@pytest.fixture(scope="module")
def web(django_db_setup: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("web") / "web.log"
    with gunicorn(log, API_STREAM_HEARTBEAT_S="2", DATABASE_POOL_SIZE=str(POOL)) as url:
        yield url


def database_connections() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()")
        (count,) = cursor.fetchone()
    return int(count)


def fan_out(width: int) -> dict[str, Any]:
    return factories.plan(name="watched", steps=0) | {
        "agents": [
            {
                "name": "a",
                "tasks": [
                    {
                        "name": "fan",
                        "mode": "parallel",
                        "max_concurrent_steps": width,
                        "steps": [factories.step(f"s{n}") for n in range(width)],
                    },
                    {"name": "join", "steps": [factories.step("j")]},
                ],
            }
        ],
    }


def follow(web: str, run_id: object, key: str) -> list[dict[str, Any]]:
    """One client: the whole stream, until the server ends it."""
    with httpx.Client(timeout=60) as http, open_stream(http, web, run_id, key) as response:
        assert response.status_code == 200, response.read()
        return [block.data for block in blocks(response.iter_lines()) if not block.keepalive]


def every_event(web: str, run_id: object, key: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    url: str | None = f"{web}/api/v1/runs/{run_id}/events?page_size=500"
    while url:
        page = httpx.get(url, headers={"Authorization": f"Bearer {key}"}, timeout=10).json()
        found += page["results"]
        url = page["next"]
    return found


def test_two_hundred_streams_on_one_gevent_process_all_follow_a_run_to_its_end(
    web: str, broker: redis.Redis[bytes]
) -> None:
    organization = factories.org(credits=100)
    _, key = api_key_create(organization=organization, name="watchers", scope="read")
    _, full = api_key_create(organization=organization, name="client", scope="full")
    run = services.run_create(organization=organization, plan=fan_out(10))
    channel = eventstreams.channel(run.pk)
    baseline = database_connections()

    with ThreadPoolExecutor(max_workers=STREAMS) as pool:
        streams = [pool.submit(follow, web, run.pk, key) for _ in range(STREAMS)]
        wait_until(
            lambda: subscribers(broker, channel) == STREAMS,
            timeout=60,
            what=f"{STREAMS} streams to be held",
        )
        # Every stream is held: the API still answers, at once.
        began = time.monotonic()
        listed = httpx.get(
            f"{web}/api/v1/runs",
            params={"page_size": 1},
            headers={"Authorization": f"Bearer {full}"},
            timeout=10,
        )
        answered_in = time.monotonic() - began
        # And none holds PostgreSQL: the web keeps what its pool keeps (at most POOL).
        connections = wait_until(
            lambda: (count := database_connections()) <= baseline + POOL + 2 and count,
            timeout=30,
            what="the held streams to give their database connections back",
        )
        still_held = sum(not stream.done() for stream in streams)
        print(
            f"{still_held} streams held; GET /runs answered in {answered_in * 1000:.0f} ms; "
            f"database connections {baseline} before, {connections} while held"
        )
        assert listed.status_code == 200
        assert listed.json()["count"] == 1
        assert answered_in < 1.0
        assert still_held == STREAMS

        started = httpx.post(
            f"{web}/api/v1/runs/{run.pk}/start", headers={"Authorization": f"Bearer {full}"}
        )
        assert started.status_code == 200, started.text
        # Each stream ends by itself once the run has ended and it has sent every event.
        followed = [stream.result(timeout=120) for stream in streams]

    events = every_event(web, run.pk, full)
    run_states = [e["to_status"] for e in events if e["entity"] == "run" and e["to_status"]]
    assert run_states[-1] == "completed"
    assert all(received == events for received in followed)
    wait_until(
        lambda: subscribers(broker, channel) == 0,
        timeout=30,
        what="the ended streams to unsubscribe",
    )
