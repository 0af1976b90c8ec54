"""Step admission: what ``run_admission`` is to a run starting, this is to a step's tool
running. It waits for its rate limits' units without holding a worker (docs/rate-limits.md).

A worker claims a step as any other; if the step spends rate limits (its plan's
``rate_limits``, or a global limit on its tool), the worker renders their keys and units
and asks here (``admit``) before it runs the tool. Granted at once: the step runs.
Otherwise the step holds a reservation, the earliest moment its units fit every window
(``ratelimits.windows``), and goes back to PENDING until then, exactly as a retry's
backoff waits: ``next_run_at`` set (it is no claimable row meanwhile and rings no
doorbell), its attempt given back, ``waiting_reason`` saying which limit it waits for,
and one message for that moment.

The line is the reservations' order, fair between organizations (a tool's bucket is
every organization's): within an organization by priority (a lower number first), then
first come, first served; between organizations, fair dispatch's rule
(docs/fairness.md) on the line: the next place goes to the organization with the fewest
steps ahead of it, by its ``share``. A step that arrives where the rule puts it before
steps already waiting (its organization's of worse priorities, or another organization's
beyond its turn) is placed there and those move back (``requeue``): so one
organization's priority-0 stream takes its turns, never the others' places for ever.
A re-planning moves at most RATE_LIMIT_REPLAN_MAX steps (the arriving one included), the
back of the line: a step never jumps further, and an ask never costs more.

A ``wait`` step parks the same way, on a timer (``timer``): PENDING until its wake
time, ``waiting_reason`` ``timer``, no worker held; the claim that wakes it completes it.

A parked step holds no place of its task's ``max_concurrent_steps`` either: parking
gives its place back (``_park``, the task's ``active_children`` less one, and
``Admission.freed`` says so: the caller's transaction dispatches the task's next ready
steps into it, ``runs.engine.dispatch.place_freed``), and the end of its wait takes one
again (``_not_waiting``, when the claim that woke it is let through), even beyond the
limit: a woken step goes on at its moment (a rate limit's units are reserved for it, a
timer's attempt only completes), and the task dispatches nothing more until it is under
its limit again. So a step holds a place while it is dispatched, open and not waiting
(``waiting_reason`` empty); a step waiting for a runner, a callback or a child run
(``runs.engine.waiting``) is running its attempt and keeps its place.

What moves reservations: a run that ends or pauses gives its back (``release_run``), and
the others of those buckets move up (the back of the line, RATE_LIMIT_REPLAN_MAX
steps); a limit changed or deleted re-plans all its waiting steps. A step whose
reservation moved is told by its row's ``next_run_at`` and a message at the new moment;
one whose row is locked just then is being claimed, and its claim reads the reservation
as it is now.

Lock order: the run's gate (shared, as a recording) and the step's row, then the buckets'
advisory locks (sorted), then the grants, then the step's task's row (its place). A
wait's timer takes its task's row before it charges the wait, the order a recording
takes (the task's row, then the reservation). A requeue holds bucket locks and updates
other runs' steps with SKIP LOCKED: it never waits for a row while holding a bucket.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Count, F, Q, QuerySet

from billing import quotas
from billing.models import Organization
from billing.pricing import wait_price
from billing.services import BudgetExhausted, credits_charge
from common.units import duration_text
from ratelimits import selectors as limits
from ratelimits import windows
from ratelimits.models import MAX_PERIOD_MS, RateGrant, RateLimit
from ratelimits.windows import Ask, Asker, clock, forget, lock, reserve, take
from runs.models import Run, Step, Task
from runs.outbox import Outbox, StepMessage, asleep
from runs.plan import Plan, PlanError
from runs.states import STEP_OPEN, RunStatus, StepStatus
from runs.transitions import lasted, lock_gate, transition_locked

WAITING_PREFIX = "rate_limited:"
TIMER = "timer"  # the waiting_reason of a wait step parked until its wake time
# What a wait step's claimed attempt reads of its row to park it.
TIMER_FIELDS = (
    "pk", "run_id", "task_id", "name", "attempt_number", "status", "attempts", "timeout_ms",
    "waiting_reason", "waited_ms", "cost",
)  # fmt: skip
# The states of a run that may hold a parked wait (an end drops its timers).
TIMED_RUNS = (
    RunStatus.RUNNING,
    RunStatus.PAUSED,
    RunStatus.RESUMING,
    RunStatus.WAITING_APPROVAL,
    RunStatus.ESCALATED,
)


@dataclass(frozen=True)
class Wanted:
    """One of the step's rate limits, its key and units rendered."""

    name: str
    key: str
    units: int


@dataclass(frozen=True)
class Admission:
    """What ``admit`` decided: ``go`` (run the tool now), or the step waits ``until``
    for ``reason``; ``dropped``: the attempt is not the step's any more (nothing done);
    ``refused``: the units can never fit, or a wait may not park (the attempt fails with
    it, ``code``)."""

    go: bool = False
    until: datetime | None = None
    reason: str = ""
    dropped: bool = False
    refused: str = ""
    # The code of the attempt's failure when refused.
    code: str = "rate_limit_exceeded"
    # For the metrics: units granted by limit, and how long the step waited in line.
    granted: tuple[tuple[str, int], ...] = ()
    waited_s: float | None = None
    # The step parked and gave its task's place back: the caller's transaction fills it
    # (runs.engine.dispatch.place_freed).
    freed: bool = False


def bucket_of(organization_id: Any, name: str, key: str) -> str:
    return f"o:{organization_id}:{name}:{key}"


def tool_bucket(tool: str) -> str:
    return f"t:{tool}"


def spends(step: Step) -> bool:
    """Whether the claimed step must ask before it runs (most steps: one list and one
    dictionary look-up)."""
    return bool(step.rate_limits) or limits.tool_limit(step.tool) is not None


# --------------------------------------------------------------------------- submission
def plan_problems(organization_id: Any, plan: Plan) -> list[PlanError]:
    """The plan's rate limits that the organization has not declared, and units that
    could never fit their limit: refused at submission (``invalid_plan``)."""
    uses = list(_uses(plan))
    if not uses:
        return []
    declared = limits.limits_named(organization_id, {use.name for _, use in uses})
    problems = []
    for path, use in uses:
        limit = declared.get(use.name)
        if limit is None:
            problems.append(PlanError(f"{path}.name", f"unknown rate limit {use.name!r}"))
        elif isinstance(use.units, int) and use.units > limit.limit:
            problems.append(
                PlanError(
                    f"{path}.units",
                    f"{use.units} units can never fit rate limit {use.name!r}"
                    f" ({limit.limit} per {duration_text(limit.period_ms)})",
                )
            )
    return problems


def _uses(plan: Plan) -> Iterable[tuple[str, Any]]:
    for a, agent in enumerate(plan.agents):
        for t, task in enumerate(agent.tasks):
            for s, step in enumerate(task.steps):
                path = f"agents[{a}].tasks[{t}].steps[{s}]"
                for kind in ("on_error", "on_callback"):
                    for h, handler in enumerate(getattr(step, kind)):
                        for u, use in enumerate(handler.rate_limits):
                            yield f"{path}.{kind}[{h}].rate_limits[{u}]", use
                for u, use in enumerate(step.rate_limits):
                    yield f"{path}.rate_limits[{u}]", use


# --------------------------------------------------------------------------- admission
def admit(
    *, step_id: int, run_id: Any, attempt: int, tool: str, wanted: Sequence[Wanted]
) -> Admission:
    """Grant the claimed attempt its units now, or make it wait for them (module doc)."""
    with transaction.atomic():
        lock_gate(run_id, shared=True)
        step = (
            Step.objects.select_for_update(no_key=True)
            .filter(pk=step_id, status=StepStatus.RUNNING, attempts=attempt)
            .only("pk", "run_id", "task_id", "status", "attempts", "timeout_ms", "waiting_reason")
            .first()
        )
        if step is None:
            return Admission(dropped=True)
        organization_id, priority = Run.objects.values_list("organization_id", "priority").get(
            pk=run_id
        )
        asks, refused = _asks(organization_id, tool, wanted)
        if refused:
            return Admission(refused=refused)
        if not asks:
            _not_waiting(step)
            return Admission(go=True)
        lock(ask.bucket for ask in asks)
        now = clock()
        held = list(RateGrant.objects.filter(step_id=step_id, used=False))
        queued_at = min((grant.queued_at for grant in held), default=now)
        if held:
            at = held[0].granted_at
            late = timedelta(seconds=float(settings.RATE_LIMIT_LATE_S))
            if at > now:
                # Woken before its moment (a message of an earlier plan): back to it.
                return _park(step, attempt, run_id, priority, at, step.waiting_reason, now)
            take(held)  # its moment came: taken (too late to use, the units are lost)
            if now - at <= late:
                _not_waiting(step)
                return _granted(asks, queued_at, now)
        asker = Asker(step_id, run_id, priority, queued_at, organization_id)
        at, binding = reserve(asks, asker, now, used=True)
        if at <= now:
            _not_waiting(step)
            return _granted(asks, queued_at, now)
        buckets = {ask.bucket for ask in asks}
        if _goes_before_a_waiter(buckets, asker, now):
            # Its place is ahead of steps waiting: the back of the line is re-planned.
            requeue(buckets, now, Outbox(), most=settings.RATE_LIMIT_REPLAN_MAX)
            at = (
                RateGrant.objects.filter(step_id=step_id, used=False)
                .values_list("granted_at", flat=True)
                .first()
                or at
            )
        Run.objects.filter(pk=run_id, rate_limited=False).update(rate_limited=True)
        return _park(step, attempt, run_id, priority, at, WAITING_PREFIX + binding.name, now)


def _asks(organization_id: Any, tool: str, wanted: Sequence[Wanted]) -> tuple[list[Ask], str]:
    declared = limits.limits_named(organization_id, {w.name for w in wanted})
    asks = []
    for w in wanted:
        limit = declared.get(w.name)
        if limit is None:
            continue  # deleted since the run was submitted: it limits nothing now
        if w.units > limit.limit:
            return [], (
                f"{w.units} units can never fit rate limit {w.name!r}"
                f" ({limit.limit} per {duration_text(limit.period_ms)})"
            )
        asks.append(_ask(limit, bucket_of(organization_id, w.name, w.key), w.units))
    tool_limit = limits.tool_limit(tool)
    if tool_limit is not None:
        asks.append(_ask(tool_limit, tool_bucket(tool), 1, name=f"tool:{tool}"))
    return asks, ""


def _ask(limit: RateLimit, bucket: str, units: int, name: str = "") -> Ask:
    return Ask(bucket, limit.pk, name or limit.name, limit.limit, limit.period_ms, units)


def _granted(asks: Sequence[Ask], queued_at: datetime, now: datetime) -> Admission:
    granted = tuple((ask.name, ask.units) for ask in asks)
    waited = (now - queued_at).total_seconds()
    return Admission(go=True, granted=granted, waited_s=waited if waited > 0 else None)


def _goes_before_a_waiter(buckets: set[str], asker: Asker, now: datetime) -> bool:
    """Whether the step just reserved at the back of ``buckets``' line belongs before a
    step waiting there (the module's order): a step of its organization of a worse
    priority, or the last of another organization's that has more steps waiting, by
    share, than this one's place in its own organization's line. Three statements at
    most; the re-planning that may follow is the costly part, done only when it moves
    someone."""
    waiting = RateGrant.objects.filter(bucket__in=buckets, used=False, granted_at__gt=now).exclude(
        step_id=asker.step_id
    )
    counts: dict[Any, int] = dict(
        waiting.order_by()
        .values("organization_id")
        .annotate(steps=Count("step_id", distinct=True))
        .values_list("organization_id", "steps")
    )
    if not counts:
        return False
    mine = asker.organization_id
    better = Q(priority__lt=asker.priority) | Q(
        priority=asker.priority, queued_at__lte=asker.queued_at
    )
    place = 1 + (
        waiting.filter(better, organization_id=mine).values("step_id").distinct().count()
        if counts.get(mine)
        else 0
    )
    if counts.get(mine, 0) >= place:
        return True  # its organization's steps of worse priorities wait ahead of it
    shares = _shares(counts.keys() | {mine})
    return any(
        steps / shares[organization] > place / shares[mine]
        for organization, steps in counts.items()
        if organization != mine
    )


def _shares(organizations: Iterable[Any]) -> dict[Any, int]:
    """Each organization's ``share`` of the workers (docs/fairness.md), 1 by default and
    for the grants that name none (made before organizations were kept)."""
    known = {organization for organization in organizations if organization is not None}
    found = dict(Organization.objects.filter(pk__in=known).values_list("pk", "share"))
    return {organization: max(1, found.get(organization, 1)) for organization in {*known, None}}


def timer(
    *, step_id: int, run_id: Any, attempt: int, until: datetime | None, for_ms: int | None
) -> Admission:
    """A wait step's claimed attempt: ``go`` once its time has come (the tool then
    completes it), else parked until ``until`` (or ``for_ms`` from now, the first claim).

    A step that has waited (``waited_ms``, added by the claim that woke it) has rung: an
    attempt claimed again after its worker was lost (the lease sweep) does not wait anew.
    The claim never lets a parked step through before its ``next_run_at``: never early.

    Parking holds a place of the organization's quota ``parked_waits`` and buys the wait's
    time (``_hold``): past the quota, or beyond the run's reservation, the attempt fails
    instead (``refused``)."""
    with transaction.atomic():
        lock_gate(run_id, shared=True)
        step = (
            Step.objects.select_for_update(no_key=True)
            .filter(pk=step_id, status=StepStatus.RUNNING, attempts=attempt)
            .only(*TIMER_FIELDS)
            .first()
        )
        if step is None:
            return Admission(dropped=True)
        if step.waiting_reason == TIMER or step.waited_ms > 0:
            _not_waiting(step)
            return Admission(go=True)
        now = clock()
        wake = until if until is not None else now + timedelta(milliseconds=for_ms or 0)
        if wake <= now:
            return Admission(go=True)
        organization_id, priority = Run.objects.values_list("organization_id", "priority").get(
            pk=run_id
        )
        _lock_task(step)
        # It pays for what it can hold: up to its wake time, or the first timeout (its
        # task's, agent's or run's) that would end it sooner.
        held_until = min(wake, _deadline(step) or wake)
        refused = _hold(step, attempt, organization_id, max(held_until - now, timedelta(0)))
        if refused is not None:
            return refused
        return _park(step, attempt, run_id, priority, wake, TIMER, now)


def timers_held(organization_id: Any) -> QuerySet[Step]:
    """The organization's wait steps parked on their timers: what its quota
    ``parked_waits`` counts. Only runs not ended hold one (an end drops its timers:
    ``release_run``); through them, each run's timers are one range of ``step_timer``."""
    open_runs = Run.objects.filter(organization_id=organization_id, status__in=TIMED_RUNS)
    return Step.objects.filter(waiting_reason=TIMER, run__in=open_runs.values("pk"))


def _deadline(step: Step) -> datetime | None:
    """When the first timeout that applies to the step would end its wait: its task's, its
    agent's or its run's (``orchestrator.sweeps.sweep_timeouts``, from when each started)."""
    clocks = ("started_at", "timeout_ms", "agent__started_at", "agent__timeout_ms")
    found = (
        Task.objects.filter(pk=step.task_id)
        .values_list(*clocks, "run__picked_up_at", "run__timeouts")
        .first()
    )
    if found is None:
        return None
    task_at, task_ms, agent_at, agent_ms, run_at, timeouts = found
    defaults = settings.RUN_TIMEOUT_DEFAULTS
    ends = [
        at + timedelta(milliseconds=int(ms) if ms else int(defaults[key]) * 1000)
        for at, ms, key in (
            (task_at, task_ms, "task"),
            (agent_at, agent_ms, "agent"),
            (run_at, (timeouts or {}).get("run"), "run"),
        )
        if at is not None
    ]
    return min(ends, default=None)


def _hold(step: Step, attempt: int, organization_id: Any, length: timedelta) -> Admission | None:
    """A wait about to park ``length``: one more of its organization's parked waits (its
    quota, counted under the quota's lock: two parks at once never both take the last
    place) and its time bought, charged now as the attempt's cost (docs/api.md, "Waits":
    per started day, ``billing.pricing.wait_price``). Once: the caller holds the step's
    row, found RUNNING this attempt, and parks it in the same transaction; the claim that
    wakes it, with the same attempt, finds it parked on its timer and charges nothing
    again (``timer``). None, or the refusal its attempt fails with."""
    organization = Organization.objects.get(pk=organization_id)
    try:
        quotas.check_quota(organization, quotas.PARKED_WAITS, held=timers_held(organization_id))
    except quotas.QuotaExceeded as exc:
        return Admission(refused=str(exc), code=exc.code)
    length_ms = math.ceil(length / timedelta(milliseconds=1))
    price = wait_price(length_ms)
    try:
        credits_charge(run_id=step.run_id, attempt_number=step.attempt_number, amount=price)
    except BudgetExhausted as exc:
        return Admission(refused=str(exc), code="budget_exhausted")
    step.cost += price
    return None


def _lock_task(step: Step) -> None:
    """The step's task's row, locked before the park charges or writes anything: the
    order a recording takes (the task's row, then the reservation)."""
    list(Task.objects.select_for_update(no_key=True).filter(pk=step.task_id).values_list("pk"))


def _not_waiting(step: Step) -> None:
    """The step's wait is over and its attempt goes on: it takes a place of its task
    again (the module's doc: even beyond the task's limit)."""
    if step.waiting_reason:
        Step.objects.filter(pk=step.pk).update(waiting_reason="")
        Task.objects.filter(pk=step.task_id).update(active_children=F("active_children") + 1)


def _park(
    step: Step,
    attempt: int,
    run_id: Any,
    priority: int,
    until: datetime,
    reason: str,
    now: datetime,
) -> Admission:
    """RUNNING -> PENDING until ``until``: the attempt is given back (it never ran), so is
    its task's place (when it held one: a step woken early parks again without one), and
    one message wakes the step then (beyond the step-message horizon, the wake sweep
    sends it: ``runs.outbox.asleep``)."""
    wait_s = max(0.0, (until - now).total_seconds())
    freed = not step.waiting_reason
    if freed:
        Task.objects.filter(pk=step.task_id).update(active_children=F("active_children") - 1)
    # A timer's cost, charged as it parks (``_hold``); a rate limit's line costs nothing.
    charged: dict[str, Any] = {}
    if reason == TIMER:
        message = f"waiting {wait_s:.3f} s on a timer, until {until.isoformat()}"
        payload: dict[str, Any] = {"timer": until.isoformat(), "cost": str(step.cost)}
        charged = {"cost": step.cost}
    else:
        name = reason.removeprefix(WAITING_PREFIX)
        message = f"waiting {wait_s:.3f} s for rate limit {name}"
        payload = {"rate_limit": name}
    transition_locked(
        step,
        StepStatus.PENDING,
        message=message,
        payload={**payload, "until": until.isoformat(), "attempt": attempt},
        updates={
            "next_run_at": until,
            "lease_expires_at": None,
            "worker": "",
            "attempts": attempt - 1,
            # The claim, kept on the row, forgotten with its worker and attempt: written
            # as its event row by the update (runs.run_history).
            "claim_event": None,
            "claimed_at": None,
            "waiting_reason": reason,
            "asleep": asleep(wait_s),
            **charged,
        },
        now=now,
    )
    Outbox().add(StepMessage(step.pk, str(run_id), priority, step.timeout_s, wait_s))
    return Admission(until=until, reason=reason, freed=freed)


# --------------------------------------------------------------------------- moving the line
def requeue(buckets: Iterable[str], now: datetime, outbox: Outbox, most: int | None = None) -> int:
    """Re-plan the reservations still ahead in ``buckets`` (and the same steps'
    reservations in other buckets): given back, then asked again in the line's order
    (the module's: organizations in turn by share, priority then arrival within each),
    under the limits as they are now. ``most``: only the steps of the last ``most``
    reservations, the back of the line (the others keep their moments, and the back
    is planned after them). Return how many steps' moments changed."""
    first = set(buckets)
    ahead = RateGrant.objects.filter(bucket__in=first, used=False, granted_at__gt=now)
    back = ahead.exclude(step_id=None).order_by("-granted_at", "-id")
    rows = back.values_list("step_id", flat=True)
    steps = set(rows if most is None else rows[:most])
    if not steps:
        return 0
    every = first | set(
        RateGrant.objects.filter(step_id__in=steps, used=False).values_list("bucket", flat=True)
    )
    lock(every)
    grants = [
        grant
        for grant in RateGrant.objects.filter(step_id__in=steps, used=False, granted_at__gt=now)
        if grant.bucket in every
    ]
    by_step: dict[int, list[RateGrant]] = {}
    for grant in grants:
        by_step.setdefault(grant.step_id or 0, []).append(grant)
    current = {
        limit.pk: limit
        for limit in RateLimit.objects.filter(pk__in={grant.limit_id for grant in grants})
    }
    # The steps that stay ahead: each organization's count, where its re-planned ones
    # take their turns from.
    ahead_of_them: dict[Any, int] = dict(
        ahead.exclude(step_id__in=steps)
        .order_by()
        .values("organization_id")
        .annotate(steps=Count("step_id", distinct=True))
        .values_list("organization_id", "steps")
    )
    forget(grants)
    moved = {}
    for held in _in_turn(list(by_step.values()), ahead_of_them):
        first_grant = held[0]
        asks = [
            Ask(g.bucket, g.limit_id, current[g.limit_id].name, current[g.limit_id].limit,
                current[g.limit_id].period_ms, min(g.units, current[g.limit_id].limit))
            for g in held
            if g.limit_id in current
        ]  # fmt: skip
        asker = Asker(
            first_grant.step_id,
            first_grant.run_id,
            first_grant.priority,
            first_grant.queued_at,
            first_grant.organization_id,
        )
        at = reserve(asks, asker, now, used=False)[0] if asks else now
        if at != first_grant.granted_at:
            moved[first_grant.step_id] = (at, first_grant.run_id, first_grant.priority)
    _tell_moved(moved, now, outbox)
    return len(moved)


def _in_turn(
    waiting: list[list[RateGrant]], ahead_of_them: dict[Any, int]
) -> list[list[RateGrant]]:
    """The steps (each its grants) in the line's order: within an organization by
    priority then arrival; between organizations fair dispatch's rule, the fewest steps
    ahead by share first, each organization counting its steps that stay ahead
    (``ahead_of_them``). So the n-th of an organization of share 1 goes after the
    (2n-1)-th of one of share 2, and the first of a newcomer after each other's first;
    alike, the step that asked first."""
    by_organization: dict[Any, list[list[RateGrant]]] = {}
    for held in waiting:
        by_organization.setdefault(held[0].organization_id, []).append(held)
    shares = _shares(by_organization)
    keyed = []
    for organization, own in by_organization.items():
        own.sort(key=lambda held: (held[0].priority, held[0].queued_at, held[0].step_id or 0))
        before = ahead_of_them.get(organization, 0)
        for place, held in enumerate(own, start=before + 1):
            keyed.append(((place / shares[organization], held[0].queued_at), held))
    keyed.sort(key=lambda item: (item[0], item[1][0].step_id or 0))
    return [held for _, held in keyed]


def _tell_moved(moved: dict[Any, tuple[datetime, Any, int]], now: datetime, outbox: Outbox) -> None:
    """Steps whose moment moved: their rows say so (those not locked just now) and a
    message wakes each at its new moment."""
    if not moved:
        return
    waiting = Step.objects.filter(
        pk__in=list(moved), status=StepStatus.PENDING, run__status=RunStatus.RUNNING
    ).exclude(waiting_reason="")
    steps = list(
        waiting.select_for_update(no_key=True, skip_locked=True, of=("self",)).only("timeout_ms")
    )
    for step in steps:
        at, run_id, priority = moved[step.pk]
        wait_s = max(0.0, (at - now).total_seconds())
        Step.objects.filter(pk=step.pk).update(next_run_at=at, asleep=asleep(wait_s))
        outbox.add(StepMessage(step.pk, str(run_id), priority, step.timeout_s, wait_s))


def release_run(run: Run, *, paused: bool = False) -> None:
    """The run ended or paused: its reservations still ahead are given back (the steps
    waiting behind them move up), and its steps wait for nothing any more (a paused
    one asks again when the run resumes). A timer is its step's own: a pause keeps it,
    with the time waited so far (the resume moves its wake time on by the time paused:
    ``timers_resumed``); an end drops it."""
    if paused:
        # What each parked step has waited until the pause: the claim that ends its wait
        # counts only from the resume (its row's status_changed_at).
        waited = lasted(run.status_changed_at, "status_changed_at", "status_changed_at")
        Step.objects.filter(run=run, status=StepStatus.PENDING).exclude(waiting_reason="").update(
            waited_ms=F("waited_ms") + waited
        )
    else:
        Step.objects.filter(run=run, waiting_reason=TIMER).update(
            waiting_reason="", next_run_at=None, asleep=False
        )
    if not run.rate_limited:
        return
    now = clock()
    lines = Step.objects.filter(run=run, waiting_reason__startswith=WAITING_PREFIX).exclude(
        waiting_reason=""  # the partial index of waiting steps
    )
    if paused:
        # They ask again when the run resumes, as steps dispatched: each with its place.
        # (An end closed the run's steps before: they hold none.)
        _take_places(lines)
    ahead = RateGrant.objects.filter(run_id=run.pk, used=False)
    buckets = set(ahead.values_list("bucket", flat=True))
    if buckets:
        lock(buckets)
        RateGrant.objects.filter(run_id=run.pk, used=False, granted_at__gt=now).delete()
        RateGrant.objects.filter(run_id=run.pk, used=False).update(used=True)
    lines.update(waiting_reason="", next_run_at=None, asleep=False)
    if buckets:
        requeue(buckets, now, Outbox(), most=settings.RATE_LIMIT_REPLAN_MAX)


def _take_places(waiting: QuerySet[Step]) -> None:
    """Open steps whose wait ends without the claim that woke them: each takes a place
    of its task again (as ``_not_waiting``)."""
    taken = (
        waiting.filter(status__in=STEP_OPEN)
        .order_by()
        .values_list("task_id")
        .annotate(steps=Count("pk"))
    )
    for task_id, steps in taken:
        Task.objects.filter(pk=task_id).update(active_children=F("active_children") + steps)


def timers_resumed(run: Run, paused_for: timedelta) -> None:
    """The run resumes after ``paused_for``: its timers wake that much later, each with
    the time it had left when the run paused."""
    Step.objects.filter(
        run=run, attempt_number=run.attempt_number, status=StepStatus.PENDING, waiting_reason=TIMER
    ).update(next_run_at=F("next_run_at") + paused_for)


# --------------------------------------------------------------------------- the limits
@transaction.atomic
def rate_limit_put(
    *, organization: Any, name: str, limit: int, period_ms: int
) -> tuple[RateLimit, bool]:
    """Declare or change the organization's limit ``name``; the steps waiting for it are
    re-planned under the new one. Returns the limit and whether it was created. A new
    one past the organization's quota: ``QuotaExceeded`` (a change is never refused)."""
    if not RateLimit.objects.filter(organization=organization, name=name).exists():
        # The others only: a PUT of the same name that won the quota's lock meanwhile
        # made this one a change.
        others = limits.rate_limit_list(organization).exclude(name=name)
        quotas.check_quota(organization, quotas.RATE_LIMITS, held=others)
    found, created = RateLimit.objects.select_for_update().get_or_create(
        organization=organization,
        name=name,
        defaults={"limit": limit, "period_ms": period_ms},
    )
    if not created and (found.limit, found.period_ms) != (limit, period_ms):
        found.limit, found.period_ms = limit, period_ms
        found.save(update_fields=["limit", "period_ms", "updated_at"])
        _limit_changed(found)
    return found, created


@transaction.atomic
def rate_limit_delete(*, organization: Any, name: str) -> bool:
    """Remove the organization's limit ``name``: it limits nothing any more, and the
    steps waiting for it go on at once. False when there was none."""
    found = (
        RateLimit.objects.select_for_update().filter(organization=organization, name=name).first()
    )
    if found is None:
        return False
    found.delete()
    _limit_changed(found)
    return True


@transaction.atomic
def limit_saved(limit: RateLimit) -> None:
    """A limit was changed or removed in the admin (an operator's global limit on a
    tool, or an organization's): its waiting steps are re-planned, as the API does."""
    limits.forget_tool_limits()
    _limit_changed(limit)


def _limit_changed(limit: RateLimit) -> None:
    # Every waiting step, however many: a lowered limit must hold for all of them (a
    # change is a person's act, not one per step).
    buckets = set(
        RateGrant.objects.filter(limit_id=limit.pk, used=False).values_list("bucket", flat=True)
    )
    if buckets:
        requeue(buckets, clock(), Outbox())


def prune_grants() -> int:
    """Forget the grants no window can count any more (older than the longest period a
    limit may have), a batch at a time (the beat sweep)."""
    return windows.prune(clock() - timedelta(milliseconds=MAX_PERIOD_MS))
