"""Executing one step attempt: claim, run the tool outside any transaction, record.

1. Claim: one conditional UPDATE moves the step PENDING -> RUNNING (and writes its
   event) only if it is pending, dispatched, due, and its run is RUNNING. A duplicate or
   late delivery, or a message for a paused or cancelled run, claims nothing: a no-op.
2. Run: the `when` condition and `${...}` parameters are resolved (secrets decrypted
   here, on the worker), then the tool runs with no transaction open, its lease renewed
   by the lease keeper thread. The secret values are redacted from what it leaves behind,
   and what PostgreSQL could not store is refused (``invalid_output``) or replaced.
3. Record: ``runs.engine.outcomes.record``, one transaction under the run's lock that
   records output, cost and state, charges the attempt, and advances the run. It
   applies only if the step is still running this attempt: a step cancelled or
   reclaimed meanwhile keeps its new state and the late result is dropped.

A worker gets there two ways. A doorbell names a run (``serve``): the worker claims the
run's next claimable step, runs and records it, and claims the next (after a short step,
a batch of the next ones, run in turn: docs/engine.md, "Batches"), each step committed
before the next is claimed, until the run has none claimable or the burst budget is
spent; each step keeps its own time limits (a SIGALRM timer for the soft one, the
lease keeper thread for the hard one). A step due later (a retry's backoff) has a message
of its own (``execute_step``), whose Celery time limits are the step's.

With tracing on, each attempt is a span of its run's trace and its recording a child
span (``orchestrator.step_spans``, docs/observability.md); off, one check per step.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any, BinaryIO

from celery.exceptions import SoftTimeLimitExceeded
from celery.signals import worker_process_init
from django.conf import settings
from django.db import InterfaceError, OperationalError
from django.db.models import Q
from django.db.models.functions import Now

from artifacts import services as artifact_services
from billing.models import Organization
from billing.pricing import tool_price
from common import logcontext, metrics, tracing
from common.connections import discard_interrupted_connection
from common.expressions import ExpressionError, parsed
from common.redaction import redact, redact_text, redactable, redacting
from common.templates import TemplateError, UnresolvedReference
from common.text import storable_text, unstorable_string
from common.tools import registry
from common.tools.base import Tool, ToolContext, ToolError
from orchestrator import asks, step_spans
from orchestrator.context import StepContext, render_params
from orchestrator.lease_keeper import Held, give_back_slot, hand_back, lease_keeper
from orchestrator.transport import CeleryTransport, serving
from orchestrator_client.tools.context import with_artifacts
from runs.admission import fairness
from runs.engine import control, hotpath
from runs.engine.dispatch import rearm, step_from_row
from runs.engine.outcomes import Outcome, record_and_claim
from runs.models import Run, Step
from runs.states import StepStatus
from runs.transitions import claim_next_step, claim_step
from runs.waits import callbacks

logger = logging.getLogger(__name__)

MAX_OUTPUT_BYTES = 1_000_000
# A server whose recordings wait longer than this for their locks (and longer than its
# steps run), this many times in a row, leaves the run to its other servers
# (``_Server.leave_if_crowded``).
CROWDED_WAIT_S = 0.005
CROWDED_AFTER = 3
# A server claims a batch (up to ENGINE_CLAIM_BATCH steps) only after a step this short:
# there the claim is a good part of a step's cost, and the steps it holds wait little
# for their start (docs/engine.md, "Batches"). After a longer one it claims one step.
BATCH_AFTER_S = 0.01


class RecordFailed(Exception):
    """Recording an attempt hit a transient database error; the outcome is kept so the
    task can retry the recording alone, without running the tool again."""

    def __init__(self, step_id: int, run_id: Any, attempt: int, outcome: Outcome) -> None:
        self.replay = {
            "step_id": step_id,
            "run_id": str(run_id),
            "attempt": attempt,
            "outcome": outcome.as_dict(),
        }
        super().__init__(f"could not record step {step_id} attempt {attempt}")


def claim(step_id: int, worker: str, task_id: str) -> Step | None:
    """Claim the step; return it (the fields an attempt needs), or None if there is
    nothing to do."""
    values = claim_step(
        step_id, worker=worker, task_id=task_id, lease_seconds=float(settings.ENGINE_LEASE_SECONDS)
    )
    return None if values is None else step_from_row(values)


def execute_step(step_id: int, *, worker: str = "", task_id: str = "") -> str:
    """Run one attempt of ``step_id``; return what happened (for logs and tests).

    A step executes in one of its organization's slots (``runs.admission.fairness``): with every
    slot held, the step is left claimable and its run's doorbell rung, for a worker that
    holds one to serve it."""
    worker = worker or f"{os.uname().nodename}:{os.getpid()}"
    found = (
        Step.objects.filter(pk=step_id)
        .annotate(
            early=Q(status=StepStatus.PENDING, dispatched_at__isnull=False, next_run_at__gt=Now())
        )
        .values_list("run_id", "run__organization_id", "run__priority", "early")
        .first()
    )
    if found is None:
        return "not claimed"
    run_id, organization_id, priority, early = found
    if early:
        # A message ahead of its step (its reservation moved later, a countdown a moment
        # early): the step's message again for what is left, or asleep for the wake
        # sweep; it takes no slot.
        rearm(step_id)
        return "early"
    with logcontext.bound(organization_id=organization_id, run_id=run_id, step_id=step_id):
        slot = fairness.acquire_slot(organization_id, f"{worker}:{os.getpid()}:{task_id}")
        if slot is None:
            CeleryTransport().ring({str(run_id): priority}, "no_slot")
            return "no slot"
        lease_keeper.hold(slot)
        try:
            step = claim(step_id, f"{worker}:{os.getpid()}", task_id)
            if step is None:
                return "not claimed"
            attempt = step.attempts
            logcontext.add(attempt=attempt)
            began = time.monotonic()
            with step_spans.attempt(step, attempt) as span:
                asked = asks.before_tool(step, attempt, span)
                if asked.waits:
                    return "waiting"
                outcome = asked.outcome or run_attempt(step, attempt)
                applied, _ = _record(step, attempt, outcome)
                asks.remember(step, asked, outcome, applied)
                step_spans.finished(span, step, outcome, applied)
            _measure(step, outcome, time.monotonic() - began, applied)
        finally:
            lease_keeper.hold(None)
            give_back_slot(slot)
    if outcome.skipped:
        return "skipped"
    return "failed" if outcome.error else "completed"


def serve(run_id: str, priority: int, *, worker: str, task_id: str, hard_limits: bool) -> int:
    """Answer a doorbell: claim, run and record claimable steps one after another;
    return how many were served.

    With fair dispatch (ENGINE_FAIR_DISPATCH, the default) the doorbell wakes a worker,
    and what it serves is ``runs.admission.fairness.next_run``'s choice, asked again every
    ENGINE_FAIR_SLICE: the organization with the fewest steps executing, then the one
    served longest ago, then its first run by priority and age, its steps or its
    pick-up. Off, it serves the doorbell's own run (for measuring fair dispatch only).
    Either way the worker holds a slot of the organization whose steps it executes.

    It stops when nothing is ready (or nothing it may take: every slot held), when the
    burst budget is spent (then it rings again, at the back of the queue), and after a
    result that was dropped: that step was cancelled, and the revoke that comes with a
    cancel may be on its way to this task, which must not be running another step when
    it lands (the transport rings for the run instead). ``hard_limits``: kill the process
    when a step outlives its hard limit (in a worker's pool process only; see
    ``orchestrator.lease_keeper``).
    """
    server = _Server(f"{worker}:{os.getpid()}", task_id, hard_limits)
    try:
        if settings.ENGINE_FAIR_DISPATCH:
            return server.fairly()
        return server.one_run(run_id, priority)
    finally:
        server.hand_back(ring=True)
        server.give_back_slot()
        metrics.doorbell_answered(server.served)


class _Server:
    """One doorbell's serving: the slot it holds, its budget, what it has served.

    Serving a run costs one round trip to PostgreSQL per step where it can: the hot
    path's recording claims the run's next step in the same call (``hotpath.Claim``),
    and once the fair slice is over, it makes the fair choice there too and claims the
    chosen run's next step instead (``hotpath.Choose``).
    """

    def __init__(self, worker: str, task_id: str, hard_limits: bool) -> None:
        self.worker = worker
        self.task_id = task_id
        self.hard_limits = hard_limits
        self.deadline = time.monotonic() + float(settings.ENGINE_BURST_SECONDS)
        self.served = 0
        self.slot: fairness.Slot | None = None
        self.holder = f"{worker}:{task_id}"
        self.helped = False  # it called for help once (a server calls once at most)
        # A step claimed for it with the last recording: served next.
        self.next: dict[str, Any] | None = None
        # A fair choice made with the last recording (fairly() acts on it).
        self.chosen: fairness.Choice | None = None
        # What the fair choice leaves out (fairly()'s, read by the recording's choice).
        self.full: set[Any] = set()
        self.skip: set[Any] = set()
        # Crowded out: it records the step in hand without claiming another, then leaves
        # the run to its other servers (``leave_if_crowded``).
        self.leaving = False
        # Its last recordings in a row that waited for their locks longer than their
        # steps ran (``leave_if_crowded``).
        self.waits = 0
        # The last recording found the run RUNNING (the hot path's): the batch's next
        # step may start without asking.
        self.confirmed = False

    def give_back_slot(self) -> None:
        if self.slot is not None:
            lease_keeper.hold(None)
            slot, self.slot = self.slot, None
            give_back_slot(slot)

    def hold(self, organization_id: Any) -> bool:
        """A slot of ``organization_id`` (the one held already, or another instead)."""
        if self.slot is not None and self.slot.organization_id == organization_id:
            return True
        self.give_back_slot()
        self.slot = fairness.acquire_slot(organization_id, self.holder)
        lease_keeper.hold(self.slot)
        return self.slot is not None

    def step(self, run_id: Any, priority: int, *, until: float = math.inf) -> bool | None:
        """Claim (unless claimed for it already), run and record ``run_id``'s next
        claimable step: None when it had none, else whether the serving goes on (False:
        it rang again, or the result was dropped). The recording claims the worker's
        next step in the same call; from ``until`` (monotonic) on, after a fair choice
        (``self.chosen``)."""
        values, self.next = self.next, None
        if values is None and lease_keeper.held is not None:
            values = self.next_held(run_id)
        if values is None:
            values = claim_next_step(
                run_id,
                worker=self.worker,
                task_id=self.task_id,
                lease_seconds=float(settings.ENGINE_LEASE_SECONDS),
            )
        if values is None:
            return None
        if values["more"] and not self.helped:
            # More is ready than this server takes: a free worker may share it. Once per
            # server: the one it wakes calls in turn (``CeleryTransport.call_for_help``).
            self.helped = True
            CeleryTransport().call_for_help(str(run_id), priority)
        step = step_from_row(values)
        attempt = step.attempts
        organization = self.slot.organization_id if self.slot is not None else None
        with logcontext.bound(
            organization_id=organization, run_id=run_id, step_id=step.pk, attempt=attempt
        ):
            began = time.monotonic()
            with step_spans.attempt(step, attempt) as span:
                asked = asks.before_tool(step, attempt, span)
                if asked.waits:
                    self.confirmed = False  # no recording: the batch's next asks first
                    return True  # it waits for its time or units without this worker
                outcome = asked.outcome or run_time_limited(
                    step, attempt, hard_limits=self.hard_limits
                )
                self.served += 1
                now = time.monotonic()
                spent = self.served >= settings.ENGINE_BURST_STEPS or now >= self.deadline
                claim = None
                if not (spent or self.leaving or lease_keeper.held is not None):
                    claim = self.claim(choose=now >= until, batch=self.batch(now - began))
                with serving(str(run_id)):
                    applied, after = _record(step, attempt, outcome, claim)
                asks.remember(step, asked, outcome, applied)
                step_spans.finished(span, step, outcome, applied)
            self.next, self.chosen, self.confirmed = after.claimed, after.chosen, after.running
            if after.held:
                lease_keeper.keep(Held(run_id, priority, self.worker, after.held))
            _measure(step, outcome, time.monotonic() - began, applied)
        if not applied or (spent and lease_keeper.held is None):
            # Spent: after the batch in hand (short steps), so as not to give it back.
            self.hand_back()  # dropped: cancelled with that step, or rung for below
            CeleryTransport().ring({str(run_id): priority}, "burst" if applied else "dropped")
            return False
        if after.waited is not None and (self.next is not None or lease_keeper.held is not None):
            self.leave_if_crowded(run_id, after.waited, now - began)
        if self.leaving and self.next is None:
            self.hand_back()
            if _served_by_another(run_id, self.task_id):
                return False  # no doorbell: the others go on
            self.leaving = False  # alone now: it stays
        return True

    def batch(self, worked_s: float) -> int:
        """How many of the run's next steps the recording may claim for this server:
        after a short step (BATCH_AFTER_S), up to ENGINE_CLAIM_BATCH, no more than its
        burst has left nor than its organization's max_running_steps; one otherwise.
        The claim takes at most half of what the run has claimable (runs.step_claim)."""
        wanted = int(settings.ENGINE_CLAIM_BATCH)
        if wanted <= 1 or worked_s > BATCH_AFTER_S or self.slot is None:
            return 1
        room = int(settings.ENGINE_BURST_STEPS) - self.served
        return max(1, min(wanted, room, self.slot.limit or wanted))

    def next_held(self, run_id: Any) -> dict[str, Any] | None:
        """The next step of the batch this server holds, when it may start: its run is
        RUNNING (the last recording found it so, as it does for a step it claims, or
        asked now) and the server is not leaving the run. Otherwise the batch is handed
        back (paused with the run, or claimable by others) and None returned."""
        if self.leaving or not (self.confirmed or _running(run_id)):
            self.hand_back()
            return None
        return lease_keeper.next_held()

    def hand_back(self, *, ring: bool = False) -> None:
        """Give back the steps of a batch this server holds and will not start; with
        ``ring``, ring for those made claimable (without: the caller rings for the run,
        or other servers of it claim them). A database that failed meanwhile leaves them
        to their leases (the sweep)."""
        held = lease_keeper.take_held()
        if held is None:
            return
        try:
            discard_interrupted_connection()
            if hand_back(held) and ring:
                CeleryTransport().ring({str(held.run_id): held.priority}, "handed_back")
        except (OperationalError, InterfaceError):
            logger.warning("%d steps of run %s left to their leases", len(held.steps), held.run_id)

    def leave_if_crowded(self, run_id: Any, waited: float, worked_s: float) -> None:
        """Whether this server should leave the run, from a recording that waited
        ``waited`` seconds for its locks and claimed the next step or has a batch's in
        hand (docs/engine.md, "One run over the fleet").

        When its last CROWDED_AFTER recordings each waited for their locks longer than
        their steps ran (and more than CROWDED_WAIT_S), the run's recordings are taking
        turns at a lock and a server fewer loses them nothing: the run is marked crowded
        (no call for help is answered for a while) and, if another server serves it,
        this one leaves after the step in hand. A no-op fan-out served by 32 workers
        waited 14 ms a step for a lock held about 1 ms; steps of 50 ms wait that long
        once in a while (a busy moment of the machine), never three times in a row."""
        self.waits = self.waits + 1 if waited > max(worked_s, CROWDED_WAIT_S) else 0
        if self.waits >= CROWDED_AFTER:
            CeleryTransport().crowded(str(run_id))
            if _served_by_another(run_id, self.task_id):
                self.leaving = True

    def claim(self, choose: bool, batch: int = 1) -> hotpath.Claim:
        """This server's claim with a recording; ``choose``: after a fair choice (with a
        slot held: the recording's run is its organization's), which claims one step;
        otherwise up to ``batch`` of the run's."""
        fair = None
        if choose and self.slot is not None:
            fair = hotpath.Choose(
                self.holder, frozenset(self.full), frozenset(self.skip), self.slot.organization_id
            )
        lease = float(settings.ENGINE_LEASE_SECONDS)
        return hotpath.Claim(self.worker, self.task_id, lease, fair, 1 if fair else batch)

    def one_run(self, run_id: str, priority: int) -> int:
        """The doorbell's own run, as before fair dispatch."""
        organization_id = Run.objects.values_list("organization_id", flat=True).get(pk=run_id)
        if not self.hold(organization_id):
            return 0  # its organization's slots are all held: their holders serve it
        while self.step(run_id, priority):
            pass
        return self.served

    def fairly(self) -> int:
        """Whatever is fairest, chosen again every slice."""
        current: fairness.Choice | None = None
        choose_at = 0.0
        slice_s = float(settings.ENGINE_FAIR_SLICE)
        while True:
            choice: fairness.Choice | None = None
            if self.chosen is not None:
                # Chosen with the last recording (its step claimed, when it could be).
                choice, self.chosen = self.chosen, None
                if choice.run_id is None:
                    return self.served  # nothing ready that it may take
            elif (
                self.next is None
                and lease_keeper.held is None  # a batch held: its run's steps come first
                and (current is None or time.monotonic() >= choose_at)
            ):
                # With a slot held, the choice claims the chosen run's next step too
                # when the run is of the slot's organization.
                claim = None
                if self.slot is not None:
                    claim = fairness.ClaimFor(
                        self.slot, self.worker, self.task_id, float(settings.ENGINE_LEASE_SECONDS)
                    )
                choice = fairness.next_run(
                    me=self.holder,
                    full=frozenset(self.full),
                    skip=frozenset(self.skip),
                    claim=claim,
                )
                if choice is None:
                    return self.served  # nothing ready that it may take
                self.next = choice.claimed
            if choice is not None:
                choose_at = time.monotonic() + slice_s * (choice.busy + 1)
                held = self.slot.organization_id if self.slot is not None else None
                if not self.hold(choice.organization_id):
                    self.full.add(choice.organization_id)
                    current = None
                    continue
                if choice.organization_id != held:
                    # Given a worker: its turn comes after the others' (an organization
                    # the worker goes on serving keeps its place).
                    fairness.served(choice.organization_id)
                if choice.pickup:
                    picked = control.pick_up(choice.run_id, actor=f"worker:{self.worker}")
                    if not picked and not _running(choice.run_id):
                        self.skip.add(choice.run_id)  # waiting for a place, or someone's pick-up
                    current = None
                    choose_at = 0.0  # its steps are ready now: choose again at once
                    continue
                if current is not None and current.run_id != choice.run_id:
                    _ring_if_ready(current)  # what it left behind gets a doorbell
                current = choice
            assert current is not None  # chosen above, or still the run of self.next
            went_on = self.step(current.run_id, current.priority, until=choose_at)
            if went_on is None:
                self.skip.add(current.run_id)  # nothing claimable (or all being claimed)
                current = None
            elif not went_on:
                return self.served


def _measure(step: Step, outcome: Outcome, duration_s: float, applied: bool) -> None:
    """The attempt's figures for Prometheus (common.metrics): its outcome, how long
    it ran and how long it waited to be claimed."""
    if not applied:
        result = "dropped"
    elif outcome.skipped:
        result = "skipped"
    else:
        result = "failed" if outcome.error else "completed"
    waited = None
    if step.dispatched_at is not None and step.status_changed_at is not None:
        waited = (step.status_changed_at - step.dispatched_at).total_seconds()
    metrics.step_attempt(step.tool, result, duration_s, waited)


def _served_by_another(run_id: Any, task_id: str) -> bool:
    """Whether another worker task holds a step of the run running (it records it, then
    goes on with the run or, leaving it, rings for what is left)."""
    return (
        Step.objects.filter(
            run_id=run_id, status=StepStatus.RUNNING, lease_expires_at__isnull=False
        )
        .exclude(celery_task_id=task_id)
        .exists()
    )


def _running(run_id: Any) -> bool:
    return Run.objects.filter(pk=run_id, status="running").exists()


def _ring_if_ready(choice: fairness.Choice) -> None:
    """A run the worker stops serving while it still has claimable steps: one doorbell,
    since its recordings rang one fewer for this worker going on with it."""
    if Step.objects.filter(
        run_id=choice.run_id, status=StepStatus.PENDING, dispatched_at__isnull=False
    ).exists():
        CeleryTransport().ring({str(choice.run_id): choice.priority}, "left")


def _record(
    step: Step, attempt: int, outcome: Outcome, claim: hotpath.Claim | None = None
) -> tuple[bool, hotpath.Next]:
    """Record the attempt (``outcomes.record_and_claim``: whether it was applied, False
    when the result was dropped, and what ``claim`` asked the recording to claim and
    choose). A database error becomes RecordFailed, so that the task replays the
    recording alone (a step claimed with it is then left to its lease: the lease sweep
    hands it on)."""
    discard_interrupted_connection()
    try:
        if tracing.enabled:
            with step_spans.recording(step, attempt, outcome):
                return record_and_claim(step.pk, step.run_id, attempt, outcome, claim)
        return record_and_claim(step.pk, step.run_id, attempt, outcome, claim)
    except (OperationalError, InterfaceError) as exc:
        raise RecordFailed(step.pk, step.run_id, attempt, outcome) from exc


_pool_process = False


@worker_process_init.connect
def _mark_pool_process(**kwargs: Any) -> None:
    global _pool_process
    _pool_process = True


def in_pool_process() -> bool:
    """True in a prefork pool's child: the one kind of process that may kill itself for
    a step's hard limit (its parent replaces it, as after Celery's own hard limit)."""
    return _pool_process


def run_time_limited(step: Step, attempt: int, *, hard_limits: bool) -> Outcome:
    """``run_attempt`` under the step's own time limits (Celery's are the doorbell's)."""
    timeout = step.timeout_s
    outcome: Outcome | None = None
    try:
        with _soft_limit(timeout):
            if hard_limits:
                lease_keeper.hard_limit(timeout + settings.ENGINE_HARD_LIMIT_GRACE)
            outcome = run_attempt(step, attempt)
    except SoftTimeLimitExceeded:
        # The timer fired after the attempt had ended but before it was disarmed.
        if outcome is None:
            outcome = _timed_out(step)
    finally:
        if hard_limits:
            lease_keeper.hard_limit(None)
    assert outcome is not None  # set by the attempt, or by the except clause
    return outcome


def _on_alarm(signum: int, frame: FrameType | None) -> None:
    raise SoftTimeLimitExceeded("step soft time limit exceeded")


@contextmanager
def _soft_limit(seconds: float) -> Iterator[None]:
    """Raise SoftTimeLimitExceeded in the step after ``seconds``, as Celery's soft limit
    does (so the tools and ``run_attempt`` treat both alike). Signals reach the main
    thread only: elsewhere (a test's thread) the step runs without this timer."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def run_attempt(step: Step, attempt: int) -> Outcome:
    """Evaluate the condition, render the parameters and run the tool (no transaction).

    The values of the secrets the parameters resolved are redacted here, once, from the
    outcome (output, error message) before anything records it, and from the log lines
    written while the tool runs (``config.logging.RedactSecrets``). The rendered
    parameters themselves are never stored: the step row keeps the template.
    """
    # A callback step's URL exists before its parameters are rendered (they may send
    # it); it is opened, in the database, only when the tool is about to use it.
    opening = callbacks.new_callback() if step.tool == "callback" else None
    context = StepContext(step, step.run_id, attempt, opening.url if opening else "")
    try:
        if step.when and not parsed(step.when).truthy(context.without_secrets("conditions")):
            return Outcome(skipped=True)
    except (ExpressionError, TemplateError, UnresolvedReference) as exc:
        return Outcome(error=ToolError("condition_error", f"when: {exc}", False))
    spec = registry.get(step.tool)
    if spec is None or spec.run is None:
        return Outcome(
            error=ToolError("tool_error", f"tool {step.tool!r} cannot run on a worker", False)
        )
    try:
        params = render_params(step.params, spec.verbatim(step.params), context)
    except (TemplateError, UnresolvedReference) as exc:
        message = redact_text(str(exc), context.secrets_used.values())
        return Outcome(error=ToolError("template_error", message, False))
    refused = spec.secret_kept(step.params, params)
    if refused:
        return Outcome(error=ToolError("invalid_input", refused, False))
    ctx = ToolContext(
        step_id=step.pk,
        run_id=str(step.run_id),
        attempt=attempt,
        timeout_s=step.timeout_s,
        stop_requested=lambda: (
            not Step.objects.filter(
                pk=step.pk, status=StepStatus.RUNNING, attempts=attempt
            ).exists()
        ),
    )
    if opening is not None:
        ctx.open_callback = lambda seconds: callbacks.open_callback(
            opening, step_id=step.pk, attempt=attempt, expires_in=seconds
        )
    saved = StepArtifacts(step)
    ctx.save_artifact = saved.save
    secrets = redactable(context.secrets_used.values())
    # Progress is stored and shown with the step: redacted as the output is.
    ctx.progress = lambda progress: lease_keeper.report_progress(
        step.pk, attempt, redact(progress, secrets) if secrets else progress
    )
    lease_keeper.begin(step.pk, step.run_id, attempt)
    try:
        with redacting(secrets):
            outcome = saved.listed_in(_run_tool(spec.run, step, params, ctx))
        return _recordable(outcome, secrets, step.tool)
    except SoftTimeLimitExceeded:  # while a large output was being redacted or checked
        return _timed_out(step)
    finally:
        lease_keeper.end()


class StepArtifacts:
    """What a step's tool saves as artifacts (``ToolContext.save_artifact``), and the
    list of them its output shows."""

    def __init__(self, step: Step) -> None:
        self.step = step
        self.saved: list[str] = []

    def save(self, name: str, stream: BinaryIO, size: int, content_type: str) -> dict[str, Any]:
        organization = Organization.objects.get(runs__pk=self.step.run_id)
        try:
            artifact = artifact_services.upload(
                organization=organization,
                run_id=self.step.run_id,
                name=name,
                stream=stream,
                size=size,
                content_type=content_type,
                step_id=self.step.pk,
            )
        except tuple(ARTIFACT_REFUSALS) as exc:
            code, retryable = ARTIFACT_REFUSALS[type(exc)]
            raise ToolError(code, f"artifact {name!r} not saved: {exc}", retryable) from exc
        self.saved.append(str(artifact.pk))
        return {
            "id": str(artifact.pk),
            "name": artifact.name,
            "size": artifact.size,
            "sha256": artifact.sha256,
            "content_type": artifact.content_type,
        }

    def listed_in(self, outcome: Outcome) -> Outcome:
        """The outcome, its output naming the artifacts saved (an output that is not an
        object is kept under ``result``)."""
        if not self.saved or outcome.wait is not None:
            return outcome
        return dataclasses.replace(outcome, output=with_artifacts(outcome.output, self.saved))


# Why an artifact was not saved, as the step's error code (and whether to retry).
ARTIFACT_REFUSALS: dict[type[Exception], tuple[str, bool]] = {
    artifact_services.ArtifactExists: ("invalid_input", False),
    artifact_services.InvalidName: ("invalid_input", False),
    artifact_services.ArtifactTooLarge: ("quota_exceeded", False),
    artifact_services.RunStorageFull: ("quota_exceeded", False),
    artifact_services.QuotaExceeded: ("quota_exceeded", False),
    artifact_services.TooManyUploads: ("rate_limited", True),
    artifact_services.StorageUnavailable: ("service_unavailable", True),
}


def _run_tool(tool: Tool, step: Step, params: dict[str, Any], ctx: ToolContext) -> Outcome:
    """Call the tool; whatever it raises becomes the outcome's error (not yet redacted)."""
    try:
        result = tool(params, ctx)
        if result.wait is not None:
            return Outcome(wait=result.wait)
        cost = tool_price(step.tool) if result.cost is None else result.cost
        return Outcome(output=result.output, cost=cost)
    except ToolError as exc:
        return Outcome(error=exc, cost=tool_price(step.tool))
    except SoftTimeLimitExceeded:
        return _timed_out(step)
    except (OperationalError, InterfaceError):
        # The database went away under the tool (its cancellation check, a template's
        # query): not the tool's failure. The attempt is abandoned; its lease expires
        # and the sweep runs it again (found by make chaos at a PostgreSQL restart).
        raise
    except Exception as exc:
        logger.exception("tool %s crashed in step %s", step.tool, step.pk)
        return Outcome(
            error=ToolError("tool_error", f"{type(exc).__name__}: {exc}", False),
            cost=tool_price(step.tool),
        )


def _timed_out(step: Step) -> Outcome:
    timeout = step.timeout_s
    return Outcome(
        error=ToolError("timeout", f"step timed out after {timeout:g}s"),
        cost=tool_price(step.tool),
    )


def _recordable(outcome: Outcome, secrets: tuple[str, ...], tool: str) -> Outcome:
    """The outcome as it may be stored: secret values redacted (output deep, keys too;
    the error message), then the output checked: stored as JSONB, it must be plain JSON
    (no NaN), and of a bounded size."""
    error = outcome.error
    if error is not None:
        # A tool's message may quote anything it met (a response body with a NUL byte);
        # it is recorded readable rather than failing the recording itself.
        message = storable_text(redact_text(error.message, secrets) if secrets else error.message)
        error = ToolError(error.code, message, error.retryable)
    output = redact(outcome.output, secrets)
    if error is None:
        try:
            encoded = json.dumps(output, allow_nan=False)
        except (TypeError, ValueError) as exc:
            message = redact_text(f"output is not JSON: {exc}", secrets)
            return Outcome(error=ToolError("invalid_output", message, False), cost=tool_price(tool))
        if len(encoded) > MAX_OUTPUT_BYTES:
            message = f"output larger than {MAX_OUTPUT_BYTES} bytes"
            return Outcome(error=ToolError("invalid_output", message, False), cost=tool_price(tool))
        # The encoding escapes every NUL (\u0000) and surrogate (\udxxx): only an output
        # showing one is walked for its path, not every step's (astral characters show
        # as surrogate pairs too, so the walk may find nothing).
        maybe = "\\u0000" in encoded or "\\ud" in encoded
        unstorable = unstorable_string(output) if maybe else None
        if unstorable is not None:
            message = f"output cannot be stored: {unstorable}"
            return Outcome(error=ToolError("invalid_output", message, False), cost=tool_price(tool))
    return Outcome(
        output=output, cost=outcome.cost, error=error, skipped=outcome.skipped, wait=outcome.wait
    )
