"""`GET /healthz`: is every part of the system up?

Database, broker, at least one worker answering a ping, and beat having ticked
recently. 200 when all are well; 503 naming what is not, so a load balancer or an
SRE's probe can act on it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.db import connection
from django.http import HttpRequest, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from config.celery import app
from orchestrator.beat import beat_client, beat_last_tick

Check = Callable[[], dict[str, Any]]


def check_database() -> dict[str, Any]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        cursor.fetchone()
    return {"ok": True}


def check_broker() -> dict[str, Any]:
    beat_client().ping()
    return {"ok": True}


def check_workers() -> dict[str, Any]:
    # limit=1: one answer proves a live worker; waiting for all would cost the full
    # timeout on every probe.
    replies = app.control.ping(timeout=settings.HEALTH_WORKER_PING_TIMEOUT, limit=1)
    workers = sorted(name for reply in replies or [] for name in reply)
    if not workers:
        return {"ok": False, "error": "no worker answered a ping"}
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
    return JsonResponse(body, status=200 if not failing else 503)
