"""The lease keeper: lease renewal for the step a worker process is running.

One daemon thread per worker process, started on first use. While a step runs, it
renews the step's lease and the run's `last_heartbeat` every ENGINE_HEARTBEAT_SECONDS
(20 s by default); a short step never waits for it and costs it nothing. If the
process dies, renewals stop and the lease sweep reclaims the step. What the step's tool
last said of its progress (``ToolContext.progress``: a published tool's
``Context.heartbeat``) goes with the renewal, in the same row write: a tool that says it
a thousand times a second still costs one write per interval. What it said after the
last renewal is written when the step ends (``end``), before its recording, in one
write guarded by the attempt; a step that said nothing since costs nothing more.

It also keeps a step's hard time limit when the worker task serves several steps (a
doorbell, whose Celery time limit cannot be the step's): past the deadline it kills its
own process, as Celery's hard limit would have, and the lease sweep takes over.

And it keeps the steps of a batch that have not started yet (``keep``: claimed with a
recording, docs/engine.md, "Batches"): the server takes them one by one
(``next_held``); steps still waiting ENGINE_CLAIM_BATCH_HOLD_SECONDS after they were
claimed (behind a step that runs long) are handed back from here, claimable by other
servers, and so are those left when the process is about to kill itself.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import (
    DatabaseError,
    InterfaceError,
    OperationalError,
    close_old_connections,
    connection,
)
from django.utils import timezone

from common import metrics
from common.connections import discard_interrupted_connection
from common.text import unstorable_string
from orchestrator.transport import CeleryTransport
from runs.admission.fairness import Slot, acquire_slot, release_slot, renew_slot
from runs.models import Run, Step
from runs.transitions import hand_back_steps

logger = logging.getLogger(__name__)

# A tool's progress larger than this, encoded, is not kept (logged instead): it is a
# note of how far the tool got, read with its step, not an output.
PROGRESS_MAX_BYTES = 64 * 1024
# No progress said since the last renewal.
_UNSAID = object()


@dataclass(frozen=True)
class Held:
    """Steps of a batch claimed for a server and not started: the claimed rows (as
    ``claim_next_step`` returns them), of one run, in plan order."""

    run_id: Any
    priority: int
    actor: str
    steps: tuple[dict[str, Any], ...]


def hand_back(held: Held) -> int:
    """Give ``held``'s steps back (``runs.transitions.hand_back_steps``); return how many
    were made claimable."""
    steps = [(step["id"], step["attempts"]) for step in held.steps]
    return hand_back_steps(held.run_id, steps, actor=held.actor)


class _LeaseKeeper:
    """The lease keeper's charge: the step's lease and hard limit, the slot held."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        # Held around a progress write (a renewal's, the end's), taken before ``lock``:
        # an end's newer progress never lands before a renewal's older one.
        self.writing = threading.Lock()
        self.current: tuple[int, Any, int] | None = None  # step id, run id, attempt
        self.since = 0.0
        # What the current step's tool said of its progress since the last renewal.
        self.progress: Any = _UNSAID
        self.deadline: float | None = None  # monotonic; the hard limit of the step
        self.thread: threading.Thread | None = None
        # The organization's slot the worker holds (runs.admission.fairness), renewed alike.
        self.slot: Slot | None = None
        self.slot_since = 0.0
        # A batch's steps not started yet, and since when they wait (monotonic).
        self.held: Held | None = None
        self.held_since = 0.0

    def begin(self, step_id: int, run_id: Any, attempt: int) -> None:
        with self.lock:
            self.current = (step_id, run_id, attempt)
            self.since = time.monotonic()
            self.progress = _UNSAID
            self._start()

    def end(self) -> None:
        """The step is no longer running here: what its tool said since the last
        renewal, if anything, is kept on its row now (``keep_progress``), or it would be
        lost with the step's last lease."""
        with self.lock:
            if self.current is None or self.progress is _UNSAID:
                self.current = None
                self.progress = _UNSAID
                return
        with self.writing:  # after a renewal in flight, which may have taken it
            with self.lock:
                current, progress = self.current, self.progress
                self.current = None
                self.progress = _UNSAID
            if current is not None and progress is not _UNSAID:
                try:
                    keep_progress(current[0], current[2], progress)
                except (DatabaseError, InterfaceError):  # a note never costs its step
                    logger.warning("step %s: last progress not kept", current[0], exc_info=True)

    def report_progress(self, step_id: int, attempt: int, progress: Any) -> None:
        """The running step's tool says how far it got: written with the next renewal
        (none while ``step_id``'s ``attempt`` is not the step running here)."""
        with self.lock:
            current = self.current
            if current is not None and (current[0], current[2]) == (step_id, attempt):
                self.progress = progress

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

    def keep(self, held: Held) -> None:
        """Keep ``held`` for the server, which takes them in turn (``next_held``)."""
        with self.lock:
            self.held = held if held.steps else None
            self.held_since = time.monotonic()
            self._start()

    def next_held(self) -> dict[str, Any] | None:
        """The next step kept for the server (now its own to start), or None: none kept,
        or they were handed back meanwhile."""
        with self.lock:
            if self.held is None:
                return None
            first, rest = self.held.steps[0], self.held.steps[1:]
            self.held = dataclasses.replace(self.held, steps=rest) if rest else None
            return first

    def take_held(self) -> Held | None:
        """All the steps kept, no longer kept (for handing back)."""
        with self.lock:
            held, self.held = self.held, None
            return held

    def _start(self) -> None:
        if self.thread is None or not self.thread.is_alive():
            self.thread = threading.Thread(target=self._loop, name="step-heartbeat", daemon=True)
            self.thread.start()

    def _loop(self) -> None:
        while True:
            interval = float(settings.ENGINE_HEARTBEAT_SECONDS)
            hold = float(settings.ENGINE_CLAIM_BATCH_HOLD_SECONDS)
            time.sleep(min(1.0, interval / 4, hold / 2))
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
                waited = self.held is not None and time.monotonic() - self.held_since >= hold
            if waited:
                self._hand_back()
            if slot_due and slot is not None:
                try:
                    renew_slot(slot)
                except Exception:
                    logger.warning("slot renewal failed", exc_info=True)
                    close_old_connections()
            if deadline is not None and time.monotonic() > deadline:
                logger.error("step %s ran past its hard time limit; killing the process", current)
                self._hand_back()  # what it will not start now, rather than by the leases
                os.kill(os.getpid(), signal.SIGKILL)
            if due and current is not None:
                try:
                    self._renew(current)
                except Exception:
                    logger.warning("lease renewal failed", exc_info=True)
                    close_old_connections()
            elif current is None and slot is None and connection.connection is not None:
                # Idle: give the connection back rather than hold it open between steps.
                connection.close()

    def _renew(self, current: tuple[int, Any, int]) -> None:
        """Renew ``current``'s lease with the progress said since the last renewal (none
        once the step has ended here: ``end`` keeps that)."""
        with self.writing:
            with self.lock:
                progress = _UNSAID
                if self.current == current:
                    progress, self.progress = self.progress, _UNSAID
            renew(*current, progress=progress)

    def _hand_back(self) -> None:
        """Hand back the steps kept; a failure leaves them to their leases (the sweep
        reclaims them as it would after a crash)."""
        held = self.take_held()
        if held is None:
            return
        try:
            if hand_back(held):  # claimable by others: a doorbell for them
                CeleryTransport().ring({str(held.run_id): held.priority}, "handed_back")
        except Exception:
            logger.warning("handing back %d steps failed", len(held.steps), exc_info=True)
            close_old_connections()


def renew(step_id: int, run_id: Any, attempt: int, *, progress: Any = _UNSAID) -> bool:
    """Extend the lease of a step still running this attempt, keeping ``progress`` (what
    its tool said since the last renewal, if anything) on its row; bump the run's
    heartbeat."""
    now = timezone.now()
    changes: dict[str, Any] = {
        "lease_expires_at": now + timedelta(seconds=float(settings.ENGINE_LEASE_SECONDS))
    }
    kept = _progress_kept(step_id, progress)
    if kept is not _UNSAID:
        changes["progress"] = {"attempt": attempt, "value": kept}
    renewed = Step.objects.filter(pk=step_id, status="running", attempts=attempt).update(**changes)
    if renewed:
        Run.objects.filter(pk=run_id).update(last_heartbeat=now)
    return bool(renewed)


def keep_progress(step_id: int, attempt: int, progress: Any) -> bool:
    """Keep ``progress`` on the step's row while it still runs ``attempt`` (its end, the
    recording not yet made), without touching its lease; whether it was kept."""
    kept = _progress_kept(step_id, progress)
    if kept is _UNSAID:
        return False
    value = {"attempt": attempt, "value": kept}
    running = Step.objects.filter(pk=step_id, status="running", attempts=attempt)
    return bool(running.update(progress=value))


def _progress_kept(step_id: int, progress: Any) -> Any:
    """``progress`` as it is kept: a copy made through JSON (the tool may change the
    object it gave meanwhile, in its own thread), or ``_UNSAID`` when there is none to
    keep: nothing said, or not what a jsonb column stores (not JSON, a NaN, a NUL
    character), or too large. The lease is renewed all the same: a note of how far a
    tool got never costs its step."""
    if progress is _UNSAID:
        return _UNSAID
    kept: Any = _UNSAID
    try:
        encoded = json.dumps(progress, allow_nan=False)
    except (TypeError, ValueError, RuntimeError) as exc:  # RuntimeError: changed meanwhile
        problem: str | None = str(exc)
    else:
        kept = json.loads(encoded)
        problem = unstorable_string(kept)
        if len(encoded) > PROGRESS_MAX_BYTES:
            problem = f"over {PROGRESS_MAX_BYTES} bytes"
    if problem is not None:
        logger.warning("step %s: progress not kept: %s", step_id, problem)
        return _UNSAID
    return kept


lease_keeper = _LeaseKeeper()


def give_back_slot(slot: Slot) -> None:
    """Give the slot back; a database that failed meanwhile lets it go by its lease
    instead (what failed is what the caller reports, not this)."""
    try:
        discard_interrupted_connection()
        release_slot(slot)
    except (OperationalError, InterfaceError):
        logger.warning("slot %s of %s left to its lease", slot.slot, slot.organization_id)


@contextmanager
def slot_held(organization_id: Any, holder: str) -> Iterator[Slot | None]:
    """One of the organization's step slots (``runs.admission.fairness``) for the block, renewed
    by this thread meanwhile and given back after; None, and nothing held, when every
    slot is taken. (The executor holds its slots across several steps, by hand.)"""
    slot = acquire_slot(organization_id, holder)
    if slot is None:
        yield None
        return
    lease_keeper.hold(slot)
    try:
        yield slot
    finally:
        lease_keeper.hold(None)
        give_back_slot(slot)
