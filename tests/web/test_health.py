"""`/healthz` reports database, broker, workers and beat, with real processes behind it."""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from celery import Celery
from django.conf import LazySettings as SettingsWrapper
from django.test import Client

from config.celery import BEAT_TICK_KEY, QUEUE_WEBHOOKS
from tests.support import Child, child_env, free_port, python_cmd, wait_until
from web import health

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


@pytest.fixture
def lone_broker(tmp_path: Path) -> Iterator[str]:
    """A Redis of its own, for workers the session's worker never hears of (their
    control messages share no server with it); its URL."""
    port = free_port()
    server = subprocess.Popen(
        ["redis-server", "--bind", "127.0.0.1", "--port", str(port), "--save", "",
         "--appendonly", "no", "--dir", str(tmp_path)],
        stdout=(tmp_path / "redis.log").open("wb"),
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    client = redis.Redis(port=port, socket_connect_timeout=1)

    def answers() -> bool:
        try:
            return bool(client.ping())
        except redis.ConnectionError:
            return False

    try:
        wait_until(answers, timeout=30, what="the lone Redis to answer")
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        client.close()
        server.terminate()
        server.wait(10)


def test_healthz_is_503_naming_workers_while_only_the_webhooks_worker_runs(
    client: Client,
    broker: redis.Redis[bytes],
    lone_broker: str,
    monkeypatch: pytest.MonkeyPatch,
    settings: SettingsWrapper,
    tmp_path: Path,
) -> None:
    """The `webhooks` process answers a ping as well as any worker, and runs no step:
    make run's banner waited for it alone and said the stack was up."""
    broker.set(BEAT_TICK_KEY, repr(time.time()))
    hostname = f"webhooks-{uuid.uuid4().hex[:8]}@localhost"
    webhooks = Child(
        python_cmd(
            "-m", "celery", "-A", "config", "worker", "--queues", QUEUE_WEBHOOKS,
            "--pool", "threads", "--hostname", hostname, "--loglevel", "WARNING",
            "--without-mingle", "--without-gossip",
        ),
        child_env(CELERY_BROKER_URL=lone_broker),
        tmp_path / "webhooks.log",
    )  # fmt: skip
    lone = Celery("lone", broker=lone_broker, set_as_current=False)
    # Celery takes CELERY_BROKER_URL from the environment before its `broker` (this
    # process's is the session's): the URLs it connects with are given by name.
    lone.conf.update(
        broker_transport_options=settings.CELERY_BROKER_TRANSPORT_OPTIONS,
        broker_read_url=lone_broker,
        broker_write_url=lone_broker,
    )
    try:
        wait_until(
            lambda: lone.control.ping(destination=[hostname], timeout=0.5),
            timeout=60,
            what="the webhooks worker to answer a ping",
        )
        monkeypatch.setattr(health, "app", lone)

        response = client.get("/healthz")
    finally:
        webhooks.stop()
        webhooks.kill_group()

    assert response.status_code == 503
    body = response.json()
    assert body["failing"] == ["workers"]
    workers = body["checks"]["workers"]
    assert workers["workers"] == [hostname]
    assert workers["error"] == (
        "no worker that answered consumes runs.high_priority, runs.normal, steps, sweeps"
    )


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
