"""Admission: when a run may start, by its organization's limits (docs/fairness.md).

- **pending**: at most `max_pending_runs` runs of an organization wait to start;
  starting one more is refused (``TooManyPendingRuns``, 429), nothing changes.
- **running**: at most `max_running_runs` are picked up and not ended (RUNNING, waiting
  for an approval, paused, resuming, escalated). One more stays PENDING with a
  `queued_reason` (never refused) and starts when a place frees, in priority then FIFO
  order.
- **concurrency keys**: a run whose plan says ``concurrency: {key, max_runs}`` starts only
  while fewer than `max_runs` runs of its organization with the same evaluated key are
  running; the others wait their turn, in the same order.

The decision is taken at the run's start when a place is free and nobody waits for one
(``on_start``, in the start's transaction), else at its pick-up (``admit``), always under
a per-organization advisory lock (so that two workers deciding at once never exceed a
limit); a run that ends, or a limit raised, asks for the waiting ones to be admitted
(``RunMessage.ADMIT``). Limits are read
from the organization's row each time: a change takes effect without a restart.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Count, Q
from django.utils import timezone

from billing.models import Organization
from runs.models import EventKind, Run
from runs.outbox import RunMessage, enqueue_run_message
from runs.states import RUN_STARTED, RunStatus
from runs.transitions import record_event

logger = logging.getLogger(__name__)

# The advisory lock namespace of admission (pg_advisory_xact_lock(namespace, key)).
LOCK_NAMESPACE = 0x7261_6E  # "ran"
ACTIVE = (RunStatus.PENDING, *RUN_STARTED)
# The queued_reason of a run held by its organization's suspension.
SUSPENDED = "the organization is suspended"
# The actor of the pauses and resumes a suspension makes (runs/people/suspension.py, and the
# engine's resume, which pauses again a run its organization's suspension caught
# resuming): how its pauses are told apart from a person's.
SUSPENSION_ACTOR = "suspension"


class TooManyPendingRuns(Exception):
    code = "too_many_pending_runs"
    retry_after = 10


@dataclass(frozen=True)
class OrgLimits:
    max_running_runs: int
    max_running_steps: int
    max_pending_runs: int
    share: int


def limits_of(organization_id: Any) -> OrgLimits:
    """The organization's limits as they stand now: its own, settings for the rest."""
    row = (
        Organization.objects.filter(pk=organization_id)
        .values("max_running_runs", "max_running_steps", "max_pending_runs", "share")
        .get()
    )
    return OrgLimits(
        max_running_runs=row["max_running_runs"] or settings.ORG_MAX_RUNNING_RUNS,
        max_running_steps=row["max_running_steps"] or settings.ORG_MAX_RUNNING_STEPS,
        max_pending_runs=row["max_pending_runs"] or settings.ORG_MAX_PENDING_RUNS,
        share=max(row["share"] or 1, 1),
    )


def lock(organization_id: Any) -> None:
    """Serialise admission decisions of one organization until the transaction ends."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_advisory_xact_lock(%s, hashtext(%s))", [LOCK_NAMESPACE, str(organization_id)]
        )


def on_start(run: Run) -> bool:
    """At a run's start (the caller holds the run's lock), under the organization's
    lock, held until commit: refuse the run when its organization has as many runs
    waiting to start as it may (``TooManyPendingRuns``), and say whether it may be
    admitted at once, which it is in the same transaction: a place free, none waiting
    for one (so no order to keep), its concurrency key's room too. The run itself is
    never counted: a start that takes the organization's locks last asks this after it
    has begun the run (``runs.engine.start``). A child run is part of its parent's
    work: never refused, never counted, admitted."""
    if run.parent_run_id is not None:
        return True
    pending, pending_limit, admitted = _at_start(run, locked=True)
    if pending >= pending_limit:
        raise TooManyPendingRuns(
            f"the organization has {pending} runs waiting to start, its limit; "
            "try again when some have started"
        )
    return admitted


def looks_free(run: Run) -> bool:
    """``on_start``'s answer as things stand, without its lock and without refusing: a
    start's guess whether it will be admitted at once, worth beginning the run for
    before asking ``on_start`` (which decides)."""
    if run.parent_run_id is not None:
        return True
    pending, pending_limit, admitted = _at_start(run, locked=False)
    return admitted and pending < pending_limit


def _at_start(run: Run, *, locked: bool) -> tuple[int, int, bool]:
    """(runs of the organization waiting to start, their limit, whether ``run`` may be
    admitted at once), from ``runs.run_admission``: one statement on every start,
    which takes the organization's lock first when ``locked``."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT * FROM runs.run_admission(%s, %s, %s, %s, %s, %s)",
            [
                run.organization_id,
                run.pk,
                run.concurrency_key,
                settings.ORG_MAX_PENDING_RUNS,
                settings.ORG_MAX_RUNNING_RUNS,
                LOCK_NAMESPACE if locked else None,
            ],
        )
        pending_limit, pending, running_limit, held, waiting, key_held = cursor.fetchone()
    if run.concurrency_key and key_held >= run.concurrency_max:
        return pending, pending_limit, False
    return pending, pending_limit, held < running_limit and not waiting


# A run holds a place among its organization's running runs from its admission (an
# admitted run not yet picked up included) until it ends (runs.run_admission counts
# the same at a start). Child runs hold none and
# never wait: they are their parent's work, and a parent waiting for a child queued
# behind it (or behind its own concurrency key) would wait forever.
TOP = Q(parent_run__isnull=True)
HOLDS_A_PLACE = TOP & (
    Q(status__in=RUN_STARTED)
    | Q(status__in=(RunStatus.PENDING, RunStatus.RETRYING), admitted_at__isnull=False)
)
WAITING = TOP & Q(status__in=(RunStatus.PENDING, RunStatus.RETRYING), admitted_at__isnull=True)


def _counts(organization_id: Any) -> tuple[int, int]:
    """(runs holding a place, runs waiting for one) of the organization."""
    row = Run.objects.filter(
        organization_id=organization_id, status__in=(*ACTIVE, RunStatus.RETRYING)
    ).aggregate(started=Count("pk", filter=HOLDS_A_PLACE), waiting=Count("pk", filter=WAITING))
    return int(row["started"]), int(row["waiting"])


def _key_running(organization_id: Any, key: str) -> int:
    return Run.objects.filter(
        HOLDS_A_PLACE, organization_id=organization_id, concurrency_key=key
    ).count()


def _ahead(run: Run) -> Any:
    """Runs of the organization waiting to start that are served before ``run``
    (priority, then FIFO)."""
    before = Q(priority__lt=run.priority) | Q(priority=run.priority, created_at__lt=run.created_at)
    before |= Q(priority=run.priority, created_at=run.created_at, pk__lt=run.pk)
    return Run.objects.filter(before, WAITING, organization_id=run.organization_id).exclude(
        pk=run.pk
    )


def why_waiting(run: Run) -> str:
    """Why ``run`` (waiting to start) may not start now, or "". The caller holds the
    lock."""
    limits = limits_of(run.organization_id)
    started, pending = _counts(run.organization_id)
    if started >= limits.max_running_runs:
        return (
            f"the organization has {started} runs running, its limit "
            f"(max_running_runs {limits.max_running_runs})"
        )
    key = run.concurrency_key
    if key:
        running = _key_running(run.organization_id, key)
        if running >= run.concurrency_max:
            return (
                f"concurrency key {key!r} has {running} runs running, its limit "
                f"({run.concurrency_max})"
            )
        ahead = _ahead(run).filter(concurrency_key=key).count()
        if running + ahead >= run.concurrency_max:
            return f"waiting behind {ahead} earlier runs with concurrency key {key!r}"
    if started + pending <= limits.max_running_runs:
        return ""  # every run waiting fits: no order to keep
    ahead = _ahead(run)
    # Runs ahead that are themselves held by their key do not hold this one back.
    blocked_keys = {
        key
        for key, limit in ahead.exclude(concurrency_key="")
        .values_list("concurrency_key", "concurrency_max")
        .distinct()
        if _key_running(run.organization_id, key) >= limit
    }
    waiting = ahead.exclude(concurrency_key__in=blocked_keys).count()
    if started + waiting >= limits.max_running_runs:
        return f"waiting behind {waiting} earlier runs of the organization"
    return ""


def admit(run_id: Any, *, actor: str = "worker") -> bool:
    """Before a pick-up: may the run start now? Its own short transaction, so that the
    organization's lock is not held while the run's agents are created: an admitted run
    holds its place from here (``admitted_at``). A run that may not start keeps why as
    its `queued_reason` (an event when the reason changes); one that is not waiting
    (picked up, ended, admitted already) is let through for the pick-up to decide."""
    # Admitted at its start (``on_start``) or by an earlier look: one read, no lock.
    admitted = Run.objects.filter(
        pk=run_id, admitted_at__isnull=False, organization__suspended_at__isnull=True
    )
    if admitted.exists():
        return True
    with transaction.atomic():
        # SKIP LOCKED: a pick-up under way holds the run (creating its agents may take
        # seconds); a second one, or a worker choosing it, leaves it to that one.
        run = Run.objects.select_for_update(no_key=True, skip_locked=True).filter(pk=run_id).first()
        if run is None:
            return not Run.objects.filter(pk=run_id).exists()
        if run.status not in (RunStatus.PENDING, RunStatus.RETRYING):
            return True
        # A suspended organization's runs do not begin, even those admitted before the
        # suspension came (their pick-up in flight): they wait, their places given back,
        # until unsuspending asks for them again (runs/people/suspension.py).
        suspended = Organization.objects.filter(
            pk=run.organization_id, suspended_at__isnull=False
        ).exists()
        if run.admitted_at is not None and not suspended:
            return True
        if run.parent_run_id is not None and not suspended:  # its parent's place (see TOP)
            Run.objects.filter(pk=run.pk).update(admitted_at=timezone.now())
            return True
        lock(run.organization_id)
        reason = SUSPENDED if suspended else why_waiting(run)
        if reason != run.queued_reason:
            record_event(
                run,
                EventKind.QUEUE,
                actor=actor,
                message=f"waiting to start: {reason}" if reason else "admitted",
                payload={"queued_reason": reason},
            )
        updates: dict[str, Any] = {
            "queued_reason": reason,
            "admitted_at": None if reason else timezone.now(),
        }
        Run.objects.filter(pk=run.pk).update(**updates)
        return not reason


def released(run: Run) -> None:
    """``run`` ended (or left the queue): the runs of its organization waiting for a
    place are looked at again, after commit, if there are any."""
    waiting = Run.objects.filter(WAITING, organization_id=run.organization_id).exclude(
        queued_reason=""
    )
    if waiting.exists():
        enqueue_run_message(RunMessage.ADMIT, run.pk, run.priority)


@transaction.atomic
def admit_waiting(organization_id: Any) -> list[Any]:
    """Ask for the pick-up of the organization's waiting runs that may start now, first
    in priority then FIFO order, as many as there are places (their pick-up decides, under
    the lock); return their ids."""
    lock(organization_id)
    limits = limits_of(organization_id)
    started, _ = _counts(organization_id)
    free = limits.max_running_runs - started
    chosen: list[Any] = []
    room: dict[str, int] = {}
    waiting = (
        Run.objects.filter(WAITING, organization_id=organization_id)
        .exclude(queued_reason="")
        .order_by("priority", "created_at", "pk")
        .values_list("pk", "priority", "concurrency_key", "concurrency_max")
    )
    for pk, priority, key, most in waiting:
        if len(chosen) >= free:
            break
        if key:
            if key not in room:
                room[key] = most - _key_running(organization_id, key)
            if room[key] <= 0:
                continue
            room[key] -= 1
        chosen.append(pk)
        enqueue_run_message(RunMessage.PICK_UP, pk, priority)
    return chosen


LIMIT_FIELDS = ("max_running_runs", "max_running_steps", "max_pending_runs", "share")


class InvalidLimits(ValueError):
    code = "invalid_limits"


def limits_set(organization_id: Any, *, actor: str, **limits: int | None) -> OrgLimits:
    """Set some of the organization's limits (None: back to the setting; ``share`` at
    least 1). They take effect at once, without a restart: every decision reads them
    from the row; runs waiting for a place that a raised limit frees are asked for,
    after commit."""
    unknown = set(limits) - set(LIMIT_FIELDS)
    if unknown:
        raise InvalidLimits(f"unknown limits: {', '.join(sorted(unknown))}")
    for name, value in limits.items():
        if value is None and name != "share":
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise InvalidLimits(f"{name} must be a whole number of at least 1")
    with transaction.atomic():
        lock(organization_id)
        Organization.objects.filter(pk=organization_id).update(**limits)
        first = (
            Run.objects.filter(WAITING, organization_id=organization_id)
            .exclude(queued_reason="")
            .values_list("pk", "priority")
            .first()
        )
        if first is not None:
            enqueue_run_message(RunMessage.ADMIT, first[0], first[1])
    logger.info("limits of organization %s set by %s: %s", organization_id, actor, limits)
    return limits_of(organization_id)


def organizations_waiting(limit: int) -> list[Any]:
    """Organizations with runs waiting for a place (the sweep looks at them again), each
    once: without ``order_by()`` the model's ordering (created_at) joined the DISTINCT, an
    organization came back once per waiting run, and each sweep pass asked for the pick-up
    of its first runs that many times (make chaos: 2,300 messages a pass, the queues
    flooded and admission starved)."""
    return list(
        Run.objects.filter(WAITING)
        .exclude(queued_reason="")
        .order_by()
        .values_list("organization_id", flat=True)
        .distinct()[:limit]
    )
