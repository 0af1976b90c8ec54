"""The beat scheduler: django-celery-beat's DatabaseScheduler that records its ticks and
sends the sweeps that wait for their work when PostgreSQL says it is due.

`/healthz` must tell whether beat is alive, and the only honest signal is beat itself
saying so: every tick writes a timestamp to Redis (at most once a second), which the
health check compares with the clock.

A sweep declared with ``next_due`` (orchestrator/periodic.py) is looked for every
``check_seconds``, or at the moment its last look named if sooner: beat asks PostgreSQL
when the sweep next has work, and sends it (the periodic task installed under its name,
with that task's queue, priority and expiry) once that moment has come. Its installed
interval, the backstop, is beat's ordinary schedule. A look that fails (the database is
away) counts as due: the sweep is sent, and retries as it always did.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import Any

import redis
from django.db import Error as DatabaseError
from django_celery_beat.schedulers import DatabaseScheduler

from common.stores import broker_redis
from config.celery import BEAT_TICK_KEY
from orchestrator.periodic import PERIODIC_PREFIX, Periodic, periodic_tasks

logger = logging.getLogger(__name__)


def beat_client() -> redis.Redis[bytes]:
    return broker_redis(socket_timeout=2, socket_connect_timeout=2)


class TrackingDatabaseScheduler(DatabaseScheduler):  # type: ignore[misc]
    _last_recorded = 0.0
    _client: redis.Redis[bytes] | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Unix time; a test drives the scheduler with a clock of its own.
        self.clock: Callable[[], float] = time.time
        self._waiting: dict[str, Periodic] | None = None
        self._next_look: dict[str, float] = {}
        super().__init__(*args, **kwargs)

    def tick(self, *args: Any, **kwargs: Any) -> float:
        interval: float = super().tick(*args, **kwargs)
        now = self.clock()
        interval = min(interval, self.send_due_sweeps(now))
        if now - self._last_recorded >= 1.0:
            try:
                if self._client is None:
                    self._client = beat_client()
                # Expiry keeps a dead beat from looking alive forever after a restore.
                self._client.set(BEAT_TICK_KEY, repr(now), ex=24 * 3600)
                self._last_recorded = now
            except redis.RedisError:
                logger.warning("beat could not record its tick", exc_info=True)
        return interval

    def send_due_sweeps(self, now: float) -> float:
        """Look for the work of each waiting sweep whose look is due; send those whose
        work is due. Returns the seconds until the next look."""
        if self._waiting is None:
            self._waiting = {
                PERIODIC_PREFIX + periodic.name: periodic
                for periodic in periodic_tasks()
                if periodic.next_due is not None
            }
        # The entries as beat last read them (``self.schedule`` would read the database
        # again): one disabled in the admin, or not installed, is absent.
        entries = self._schedule or {}
        wake = math.inf
        for name, periodic in self._waiting.items():
            entry = entries.get(name)
            if entry is None:
                continue
            look = self._next_look.get(name, now)
            if look <= now:
                due = self._due(periodic)
                if due is not None and due <= now:
                    self.apply_entry(entry, producer=self.producer)
                    due = None
                look = now + periodic.check_seconds
                if due is not None:
                    look = min(look, due)
                self._next_look[name] = look
            wake = min(wake, look - now)
        return wake

    @staticmethod
    def _due(periodic: Periodic) -> float | None:
        """Unix time at which the sweep next has work; None when it has none in sight."""
        assert periodic.next_due is not None
        try:
            due = periodic.next_due()
        except DatabaseError:
            logger.warning("beat could not look for %s's work: sent", periodic.name, exc_info=True)
            return -math.inf
        return due.timestamp() if due is not None else None
