"""Lease renewal for the step a worker process is running.

One daemon thread per worker process, started on first use. While a step runs, it
renews the step's lease and the run's `last_heartbeat` every ENGINE_HEARTBEAT_SECONDS
(SPEC: at least every 20 s); a short step never waits for it and costs it nothing. If the
process dies, renewals stop and the lease sweep reclaims the step.

It also keeps a step's hard time limit when the worker task serves several steps (a
doorbell, whose Celery time limit cannot be the step's): past the deadline it kills its
own process, as Celery's hard limit would have, and the lease sweep takes over.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import close_old_connections, connection
from django.utils import timezone

from common import metrics
from runs.fairness import Slot, renew_slot
from runs.models import Run, Step

logger = logging.getLogger(__name__)


class _LeaseKeeper:
    """The heartbeat thread's charge: the step's lease and hard limit, the slot held."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.current: tuple[int, Any, int] | None = None  # step id, run id, attempt
        self.since = 0.0
        self.deadline: float | None = None  # monotonic; the hard limit of the step
        self.thread: threading.Thread | None = None
        # The organization's slot the worker holds (runs.fairness), renewed alike.
        self.slot: Slot | None = None
        self.slot_since = 0.0

    def begin(self, step_id: int, run_id: Any, attempt: int) -> None:
        with self.lock:
            self.current = (step_id, run_id, attempt)
            self.since = time.monotonic()
            self._start()

    def end(self) -> None:
        with self.lock:
            self.current = None

    def hold(self, slot: Slot | None) -> None:
        """Renew ``slot`` while it is held (None: none held any more)."""
        with self.lock:
            self.slot = slot
            self.slot_since = time.monotonic()
            if slot is not None:
                self._start()

    def hard_limit(self, seconds: float | None) -> None:
        """Kill this process if the step is still running ``seconds`` from now (None:
        no limit of ours)."""
        with self.lock:
            self.deadline = None if seconds is None else time.monotonic() + seconds
            if seconds is not None:
                self._start()

    def _start(self) -> None:
        if self.thread is None or not self.thread.is_alive():
            self.thread = threading.Thread(target=self._loop, name="step-heartbeat", daemon=True)
            self.thread.start()

    def _loop(self) -> None:
        interval = float(settings.ENGINE_HEARTBEAT_SECONDS)
        tick = min(1.0, interval / 4)
        while True:
            time.sleep(tick)
            # The step figures this process summed reach Redis within a second or two,
            # busy or idle (common.metrics).
            metrics.flush_if_due()
            with self.lock:
                current, since, deadline = self.current, self.since, self.deadline
                due = current is not None and time.monotonic() - since >= interval
                if due:
                    self.since = time.monotonic()
                slot = self.slot
                slot_due = slot is not None and time.monotonic() - self.slot_since >= interval
                if slot_due:
                    self.slot_since = time.monotonic()
            if slot_due and slot is not None:
                try:
                    renew_slot(slot)
                except Exception:
                    logger.warning("slot renewal failed", exc_info=True)
                    close_old_connections()
            if deadline is not None and time.monotonic() > deadline:
                logger.error("step %s ran past its hard time limit; killing the process", current)
                os.kill(os.getpid(), signal.SIGKILL)
            if due and current is not None:
                try:
                    renew(*current)
                except Exception:
                    logger.warning("lease renewal failed", exc_info=True)
                    close_old_connections()
            elif current is None and slot is None and connection.connection is not None:
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


lease_keeper = _LeaseKeeper()
