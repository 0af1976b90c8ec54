"""Throttling per API key, shared by every web process (Redis), ``API_THROTTLE_RATE``.

The limiter is GCRA (the generic cell rate algorithm): one Redis key per API key holds
the theoretical arrival time of the next request; a burst of up to the whole rate is
allowed, then requests are spaced evenly (``1200/min``: 1,200 at once, then one every
50 ms). One Lua script reads and advances it atomically, on Redis's clock, so every
process and host agrees. If Redis cannot be reached the request is let through (and a
warning logged): throttling protects the service, it must not take it down.
"""

from __future__ import annotations

import functools
import logging
import math
from typing import Any

import redis
from django.conf import settings
from rest_framework.request import Request
from rest_framework.throttling import BaseThrottle

from billing.models import ApiKey
from common.stores import broker_redis

logger = logging.getLogger(__name__)

KEY_PREFIX = "orchestrator:throttle:"
PERIODS = {"s": 1, "m": 60, "h": 3600, "d": 86400}

# KEYS[1]: the API key's slot. ARGV: emission interval and burst tolerance, in ms.
# Returns 0 when the request is allowed, else the milliseconds until it would be.
GCRA = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + tonumber(clock[2]) / 1000
local interval = tonumber(ARGV[1])
local tolerance = tonumber(ARGV[2])
local tat = tonumber(redis.call('GET', KEYS[1]) or '0')
if tat < now then tat = now end
local next_tat = tat + interval
local allowed_at = next_tat - tolerance
if allowed_at > now then
  return math.ceil(allowed_at - now)
end
redis.call('SET', KEYS[1], string.format('%.3f', next_tat), 'PX', math.ceil(next_tat - now))
return 0
"""


def parse_rate(rate: str) -> tuple[int, int]:
    """``"1200/min"`` -> (1200, 60): requests and seconds."""
    count, _, period = rate.partition("/")
    seconds = PERIODS.get(period.strip()[:1])
    if not count.strip().isdigit() or int(count) < 1 or seconds is None:
        raise ValueError(f"API_THROTTLE_RATE must look like '1200/min', got {rate!r}")
    return int(count), seconds


@functools.lru_cache(maxsize=4)
def _script(url: str) -> Any:
    client = broker_redis(url=url, socket_timeout=1, socket_connect_timeout=1)
    return client.register_script(GCRA)


class ApiKeyRateThrottle(BaseThrottle):
    def __init__(self) -> None:
        self.wait_seconds: float | None = None

    def allow_request(self, request: Request, view: Any) -> bool:
        api_key = request.auth
        if not isinstance(api_key, ApiKey):
            return True  # unauthenticated requests are refused before they cost anything
        count, seconds = parse_rate(settings.API_THROTTLE_RATE)
        period_ms = seconds * 1000
        try:
            wait_ms = int(
                _script(settings.CELERY_BROKER_URL)(
                    keys=[f"{KEY_PREFIX}{api_key.pk}"], args=[period_ms / count, period_ms]
                )
            )
        except redis.RedisError:
            logger.warning("throttling skipped: Redis unavailable", exc_info=True)
            return True
        if wait_ms > 0:
            self.wait_seconds = wait_ms / 1000
            return False
        return True

    def wait(self) -> float | None:
        return None if self.wait_seconds is None else max(1.0, math.ceil(self.wait_seconds))
