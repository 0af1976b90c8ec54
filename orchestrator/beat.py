"""The beat scheduler: django-celery-beat's DatabaseScheduler that records its ticks.

`/healthz` must tell whether beat is alive, and the only honest signal is beat itself
saying so: every tick writes a timestamp to Redis (at most once a second), which the
health check compares with the clock.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import redis
from django_celery_beat.schedulers import DatabaseScheduler

from common.stores import broker_redis

logger = logging.getLogger(__name__)

BEAT_TICK_KEY = "orchestrator:beat:last_tick"


def beat_client() -> redis.Redis[bytes]:
    return broker_redis(socket_timeout=2, socket_connect_timeout=2)


def beat_last_tick() -> float | None:
    """Unix time of beat's last recorded tick, or None if it never ticked."""
    value = beat_client().get(BEAT_TICK_KEY)
    return float(value) if value is not None else None


class TrackingDatabaseScheduler(DatabaseScheduler):  # type: ignore[misc]
    _last_recorded = 0.0
    _client: redis.Redis[bytes] | None = None

    def tick(self, *args: Any, **kwargs: Any) -> float:
        interval: float = super().tick(*args, **kwargs)
        now = time.time()
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
