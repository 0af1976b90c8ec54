"""`GET /healthz`: is every part of the system up?

Database, broker, workers answering that consume every queue the engine's tasks go to
(runs, steps, sweeps: the `webhooks` process answers too, and runs no step), and beat
having ticked recently. 200 when all are well; 503 naming what is not, so a load
balancer or an SRE's probe can act on it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import redis
from django.conf import settings
from django.db import connection
from django.http import HttpRequest, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from common.stores import broker_redis
from config.celery import BEAT_TICK_KEY, WORKER_QUEUES, app

logger = logging.getLogger(__name__)

Check = Callable[[], dict[str, Any]]


def check_database() -> dict[str, Any]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        cursor.fetchone()
    return {"ok": True}


def _broker() -> redis.Redis[bytes]:
    # Short timeouts: a probe is answered within seconds, whatever the broker does.
    return broker_redis(socket_timeout=2, socket_connect_timeout=2)


def beat_last_tick() -> float | None:
    """Unix time of beat's last recorded tick, or None if it never ticked."""
    value = _broker().get(BEAT_TICK_KEY)
    return float(value) if value is not None else None


def check_broker() -> dict[str, Any]:
    _broker().ping()
    return {"ok": True}


def check_workers() -> dict[str, Any]:
    # Each worker's queues, not a ping: any one answer would do for a ping, the webhooks
    # sender's too, while no step can run. Every worker is waited for, so a probe takes
    # HEALTH_WORKER_PING_TIMEOUT.
    inspect = app.control.inspect(timeout=settings.HEALTH_WORKER_PING_TIMEOUT)
    replies = inspect.active_queues() or {}
    workers = sorted(replies)
    if not workers:
        return {"ok": False, "error": "no worker answered"}
    consumed = {queue["name"] for queues in replies.values() for queue in queues or []}
    missing = [queue for queue in WORKER_QUEUES if queue not in consumed]
    if missing:
        return {
            "ok": False,
            "workers": workers,
            "error": f"no worker that answered consumes {', '.join(missing)}",
        }
    return {"ok": True, "workers": workers}


def check_beat() -> dict[str, Any]:
    last = beat_last_tick()
    if last is None:
        return {"ok": False, "error": "beat has never ticked"}
    age = round(time.time() - last, 1)
    if age > settings.HEALTH_BEAT_MAX_AGE:
        return {"ok": False, "last_tick_age_s": age, "error": "beat tick is stale"}
    return {"ok": True, "last_tick_age_s": age}


CHECKS: dict[str, Check] = {
    "database": check_database,
    "broker": check_broker,
    "workers": check_workers,
    "beat": check_beat,
}


def run_checks() -> dict[str, dict[str, Any]]:
    results: dict[str, dict[str, Any]] = {}
    for name, check in CHECKS.items():
        try:
            results[name] = check()
        except Exception as exc:  # noqa: BLE001 - any failure is a health finding
            results[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    return results


@never_cache
@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    checks = run_checks()
    failing = [name for name, result in checks.items() if not result["ok"]]
    body = {"status": "ok" if not failing else "fail", "failing": failing, "checks": checks}
    response = JsonResponse(body, status=200 if not failing else 503)
    if failing:
        # A probe is asked to find what is down (a start waits on it, a load balancer
        # acts on it): an answer, not the server's error. One INFO line, not
        # django.request's ERROR for a 5xx (Django's own mark of a response logged).
        logger.info("health check failing: %s", ", ".join(failing))
        response._has_been_logged = True  # type: ignore[attr-defined]
    return response
