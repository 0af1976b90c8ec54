"""`/healthz` reports database, broker, workers and beat, with real processes behind it."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import redis
from celery import Celery
from django.conf import LazySettings as SettingsWrapper
from django.test import Client

from orchestrator import health
from orchestrator.beat import BEAT_TICK_KEY
from tests.support import Child, child_env, free_port, python_cmd, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def beat(
    celery_worker: str, broker: redis.Redis[bytes], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Child]:
    broker.delete(BEAT_TICK_KEY)
    process = Child(
        python_cmd("-m", "celery", "-A", "config", "beat", "--pidfile=", "--loglevel", "INFO"),
        child_env(),
        tmp_path_factory.mktemp("beat") / "beat.log",
    )
    try:
        wait_until(lambda: broker.get(BEAT_TICK_KEY), timeout=60, what="beat's first tick")
        yield process
    finally:
        process.stop()
        process.kill_group()


def test_healthz_is_200_when_database_broker_worker_and_beat_are_up(
    client: Client, beat: Child, celery_worker: str
) -> None:
    response = client.get("/healthz")

    assert response.status_code == 200, response.json()
    body = response.json()
    assert body["status"] == "ok"
    assert body["failing"] == []
    assert celery_worker in body["checks"]["workers"]["workers"]
    assert body["checks"]["beat"]["last_tick_age_s"] < 60


def test_healthz_is_503_naming_beat_when_it_never_ticked(
    client: Client, celery_worker: str, broker: redis.Redis[bytes]
) -> None:
    broker.delete(BEAT_TICK_KEY)

    response = client.get("/healthz")

    assert response.status_code == 503
    assert response.json()["failing"] == ["beat"]


def test_healthz_is_503_naming_a_stale_beat(
    client: Client, celery_worker: str, broker: redis.Redis[bytes], settings: SettingsWrapper
) -> None:
    broker.set(BEAT_TICK_KEY, repr(time.time() - settings.HEALTH_BEAT_MAX_AGE - 5))

    body = client.get("/healthz").json()

    assert body["failing"] == ["beat"]
    assert body["checks"]["beat"]["error"] == "beat tick is stale"


def test_healthz_is_503_naming_workers_when_none_answers(
    client: Client,
    broker: redis.Redis[bytes],
    monkeypatch: pytest.MonkeyPatch,
    settings: SettingsWrapper,
) -> None:
    broker.set(BEAT_TICK_KEY, repr(time.time()))
    # A real broker no worker listens on: the same Redis server, another database.
    lonely = Celery(
        "lonely",
        broker=settings.CELERY_BROKER_URL.rsplit("/", 1)[0] + "/9",
        # Not the current app: shared tasks resolve through it, and later tests would
        # publish through this one (without a result backend) instead of the project's.
        set_as_current=False,
    )
    # Redis pub/sub is shared by every database of a server: without a channel prefix of
    # its own, this app's ping (with kombu's default separator) reached the session's
    # worker, which could not parse its reply binding and died, failing every later test
    # that needed it.
    lonely.conf.broker_transport_options = {
        **settings.CELERY_BROKER_TRANSPORT_OPTIONS,
        "fanout_prefix": "/lonely.",
    }
    monkeypatch.setattr(health, "app", lonely)
    settings.HEALTH_WORKER_PING_TIMEOUT = 0.3

    response = client.get("/healthz")

    assert response.status_code == 503
    assert response.json()["failing"] == ["workers"]


def test_healthz_is_503_naming_the_broker_when_redis_is_unreachable(
    client: Client, settings: SettingsWrapper, monkeypatch: pytest.MonkeyPatch
) -> None:
    dead = f"redis://127.0.0.1:{free_port()}/0"
    settings.CELERY_BROKER_URL = dead
    # A worker ping would retry its connection for a long while; the broker check is
    # what this test is about.
    monkeypatch.setitem(health.CHECKS, "workers", lambda: {"ok": True})

    body = client.get("/healthz").json()

    assert "broker" in body["failing"]
    assert "beat" in body["failing"]
    assert "database" not in body["failing"]
