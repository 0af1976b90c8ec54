"""Lease renewal for the step a worker process is running.

One daemon thread per worker process, started on first use. While a step runs, it
renews the step's lease and the run's `last_heartbeat` every ENGINE_HEARTBEAT_SECONDS
(SPEC: at least every 20 s); a short step never waits for it and costs it nothing. If the
process dies, renewals stop and the lease sweep reclaims the step.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import close_old_connections, connection
from django.utils import timezone

from runs.models import Run, Step

logger = logging.getLogger(__name__)


class _Heart:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.current: tuple[int, Any, int] | None = None  # step id, run id, attempt
        self.since = 0.0
        self.thread: threading.Thread | None = None

    def begin(self, step_id: int, run_id: Any, attempt: int) -> None:
        with self.lock:
            self.current = (step_id, run_id, attempt)
            self.since = time.monotonic()
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(
                    target=self._loop, name="step-heartbeat", daemon=True
                )
                self.thread.start()

    def end(self) -> None:
        with self.lock:
            self.current = None

    def _loop(self) -> None:
        interval = float(settings.ENGINE_HEARTBEAT_SECONDS)
        tick = min(1.0, interval / 4)
        while True:
            time.sleep(tick)
            with self.lock:
                current, since = self.current, self.since
                due = current is not None and time.monotonic() - since >= interval
                if due:
                    self.since = time.monotonic()
            if due and current is not None:
                try:
                    renew(*current)
                except Exception:
                    logger.warning("lease renewal failed", exc_info=True)
                    close_old_connections()
            elif current is None and connection.connection is not None:
                # Idle: give the connection back rather than hold it open between steps.
                connection.close()


def renew(step_id: int, run_id: Any, attempt: int) -> bool:
    """Extend the lease of a step still running this attempt; bump the run's heartbeat."""
    now = timezone.now()
    lease = now + timedelta(seconds=float(settings.ENGINE_LEASE_SECONDS))
    renewed = Step.objects.filter(pk=step_id, status="running", attempts=attempt).update(
        lease_expires_at=lease
    )
    if renewed:
        Run.objects.filter(pk=run_id).update(last_heartbeat=now)
    return bool(renewed)


heart = _Heart()
