"""Wake-ups of the live event streams (common/eventstreams.py) against the real Redis:
published after commit, once per transaction and run, for watched runs only, and never
at the cost of a write."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from django.db import transaction

from common import eventstreams
from runs.models import Run
from runs.selectors import run_history
from runs.transitions import record_event
from tests import factories
from tests.support import free_port

pytestmark = pytest.mark.django_db(transaction=True)

SENTINEL = b"sentinel"


@pytest.fixture(autouse=True)
def _fresh_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts as a process that has not read the watched runs yet."""
    monkeypatch.setattr(eventstreams, "_copy", eventstreams._Copy())


def watch(*runs: Run, ttl_s: float = 60) -> None:
    """Watch ``runs``, and forget this process's copy of the watched runs (creating the
    runs read it, and a copy is kept for ``REFRESH_S``: a writer sees a new watch within
    that, by design; here at its next write)."""
    for run in runs:
        eventstreams.watch(run.pk, ttl_s)
    eventstreams._copy.refresh_at = 0


class Listener:
    """A subscriber of some runs' channels. ``heard`` publishes a sentinel on the first
    channel and returns what arrived before it: Redis delivers a channel's messages in
    the order it took the PUBLISH commands, so whatever a write published (synchronously,
    before the sentinel) comes first."""

    def __init__(self, broker: redis.Redis[bytes], *runs: Run) -> None:
        self.broker = broker
        self.channels = [eventstreams.channel(run.pk) for run in runs]
        self.pubsub = broker.pubsub(ignore_subscribe_messages=True)
        self.pubsub.subscribe(*self.channels)

    def heard(self) -> list[str]:
        self.broker.publish(self.channels[0], SENTINEL)
        heard: list[str] = []
        while True:
            message = self.pubsub.get_message(timeout=10)
            if message is None:
                continue
            if message["data"] == SENTINEL:
                return heard
            heard.append(message["channel"].decode())


@pytest.fixture
def listen(broker: redis.Redis[bytes]) -> Iterator[Any]:
    listeners: list[Listener] = []

    def start(*runs: Run) -> Listener:
        listener = Listener(broker, *runs)
        listeners.append(listener)
        return listener

    yield start
    for listener in listeners:
        listener.pubsub.close()


def test_a_run_nobody_watches_is_never_announced(listen: Any) -> None:
    run = factories.run()
    listener = listen(run)

    with transaction.atomic():
        record_event(run, "operator", message="inside a transaction")
    record_event(run, "operator", message="in autocommit")

    assert listener.heard() == []


def test_a_watched_run_is_announced_once_per_transaction_after_its_commit(listen: Any) -> None:
    run, other = factories.run(), factories.run()
    watch(run, other)
    listener = listen(run, other)

    with transaction.atomic():
        for n in range(3):
            record_event(run, "operator", message=f"note {n}")
        record_event(other, "operator", message="the other run")
        assert listener.heard() == []  # nothing before the commit
    after_commit = listener.heard()
    record_event(run, "operator", message="in autocommit")
    at_once = listener.heard()

    assert sorted(after_commit) == sorted(listener.channels)
    assert at_once == [eventstreams.channel(run.pk)]


def test_a_rolled_back_transaction_announces_nothing_and_the_next_one_does(listen: Any) -> None:
    run = factories.run()
    watch(run)
    listener = listen(run)

    def rolled_back_write() -> None:
        with transaction.atomic():
            record_event(run, "operator", message="rolled back")
            raise RuntimeError("roll back")

    with pytest.raises(RuntimeError):
        rolled_back_write()
    rolled_back = listener.heard()
    with transaction.atomic():
        try:
            with transaction.atomic():  # a savepoint that rolls back
                record_event(run, "operator", message="in a savepoint")
                raise RuntimeError("roll back the savepoint")
        except RuntimeError:
            pass
        record_event(run, "operator", message="kept")
    kept = listener.heard()

    assert rolled_back == []
    assert kept == [eventstreams.channel(run.pk)]


def test_a_lapsed_watch_is_no_longer_announced(listen: Any, broker: redis.Redis[bytes]) -> None:
    run = factories.run()
    watch(run, ttl_s=-1)  # lapsed already
    listener = listen(run)

    record_event(run, "operator", message="nobody is watching any more")

    assert listener.heard() == []
    assert broker.zscore(eventstreams.WATCHED, str(run.pk)) is None  # and dropped


def test_without_redis_events_are_still_written_and_the_outage_logged_once(
    settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    run = factories.run()
    settings.CELERY_BROKER_URL = f"redis://127.0.0.1:{free_port()}/0"

    with caplog.at_level(logging.WARNING, logger="common.eventstreams"):
        for n in range(3):
            eventstreams._copy.refresh_at = 0  # each write reads the watched runs again
            record_event(run, "operator", message=f"note {n}")

    assert run_history(run).filter(kind="operator").count() == 3
    warnings = [r.getMessage() for r in caplog.records if r.name == "common.eventstreams"]
    assert len(warnings) == 1
    assert warnings[0].startswith("live event streams get no wake-ups: Redis:")
