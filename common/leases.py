"""Places an organization holds while something of it is open, counted in Redis for a
quota (docs/tenants.md, "Quotas"): its open event streams (``common.eventstreams``), its
held runner polls (api/runners.py).

One sorted set per organization and kind (``key``), a member per holder scored by when
its lease lapses. Taking a place runs a Lua script that drops the lapsed leases, counts
the rest and adds the new one only if there is room, atomically: two holders arriving at
once never both take the last place. The holder renews its lease while it lasts and
removes it when it ends; a process that dies leaves its leases behind, and they lapse
after ``ttl_s``, so a crash frees its places instead of leaking them (a counter, ``INCR``
and ``DECR``, would lose a place for good to every process that died holding one).

Without Redis nothing is counted: the holder goes on uncounted (an outage slows a
stream or a poll down, it refuses none), and ``held`` reads 0.

This module is the shared leaf's: it names no app.
"""

from __future__ import annotations

import functools
import logging
import time
import uuid
from typing import Any

import redis
from django.conf import settings

from common.stores import broker_redis

logger = logging.getLogger(__name__)

# A place is never worth a wait: a Redis that does not answer at once is down.
REDIS_TIMEOUT_S = 1.0

# Atomic, so that two holders arriving at once never both take the last place: drop the
# lapsed leases, count, add this one if there is room. KEYS[1]: the set; ARGV: now, when
# the lease lapses, the quota, the holder's id, the set's own expiry (s).
_TAKE = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[3]) then
    return 0
end
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[4])
redis.call('EXPIRE', KEYS[1], ARGV[5])
return 1
"""


@functools.lru_cache(maxsize=2)
def _redis(url: str) -> redis.Redis[bytes]:
    return broker_redis(
        url=url, socket_timeout=REDIS_TIMEOUT_S, socket_connect_timeout=REDIS_TIMEOUT_S
    )


def quick_client() -> redis.Redis[bytes]:
    """The broker's Redis, for what is never worth a wait (leases, wake-ups): a Redis that
    does not answer within REDIS_TIMEOUT_S is taken as down."""
    return _redis(settings.CELERY_BROKER_URL)


@functools.lru_cache(maxsize=2)
def _take_script(url: str) -> Any:
    return _redis(url).register_script(_TAKE)


class Lease:
    """One holder's place in the set ``key`` (what it holds: ``what``, for the logs)."""

    def __init__(self, key: str, ttl_s: float, what: str) -> None:
        self.key = key
        self.ttl_s = ttl_s
        self.what = what
        self.holder_id = uuid.uuid4().hex

    def take(self, limit: int) -> bool:
        """Count this holder if the set has fewer than ``limit`` live leases; False when
        it has as many (nothing taken)."""
        now = time.time()
        try:
            taken = _take_script(settings.CELERY_BROKER_URL)(
                keys=[self.key],
                args=[now, now + self.ttl_s, limit, self.holder_id, int(self.ttl_s) + 1],
            )
        except (redis.RedisError, OSError) as exc:
            logger.warning("%s taken uncounted (Redis: %s)", self.what, exc)
            return True
        return bool(taken)

    def renew(self) -> None:
        """The lease extended (taken again if it lapsed, or was never counted for want of
        Redis: the holder is there, it counts)."""
        try:
            with quick_client().pipeline(transaction=False) as pipe:
                pipe.zadd(self.key, {self.holder_id: time.time() + self.ttl_s})
                pipe.expire(self.key, int(self.ttl_s) + 1)
                pipe.execute()
        except (redis.RedisError, OSError) as exc:
            # Not a warning per holder and renewal: an outage is reported elsewhere.
            logger.debug("%s's lease not renewed (Redis: %s)", self.what, exc)

    def release(self) -> None:
        """The holder ended: its place is free at once."""
        try:
            quick_client().zrem(self.key, self.holder_id)
        except (redis.RedisError, OSError) as exc:
            logger.warning("%s's lease not released, it lapses (Redis: %s)", self.what, exc)


def held(key: str) -> int:
    """How many live leases the set ``key`` has; 0 when Redis does not answer."""
    try:
        return int(quick_client().zcount(key, time.time(), "+inf"))
    except (redis.RedisError, OSError) as exc:
        logger.warning("%s not counted (Redis: %s)", key, exc)
        return 0
