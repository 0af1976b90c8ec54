"""Every operation on a schedule, one service each (docs/schedules.md).

The API, the admin and the beat tick call these and nothing else writes a schedule.
Each runs in one transaction and locks the schedule's row first, so that an edit, a
pause, a trigger and a tick never interleave on the same schedule; a tick skips a
schedule another transaction holds (``SKIP LOCKED``) and the next tick takes it.

A due time is fired at most once: the tick advances ``next_due_at`` under the row's lock,
and PostgreSQL's unique (schedule, due time) refuses a second fire whatever got past the
lock (two beats publishing the same tick, a tick retried after its commit was lost).
Firing starts a run through ``runs.services`` as the API does; what refuses it (credits,
the organization's pending runs, a plan that no longer validates, its suspension) is
recorded as a skipped fire with its reason, and the schedule goes on; refused for credits
SCHEDULES_PAUSE_AFTER_CREDIT_REFUSALS times in a row, it pauses itself
(``paused_reason: insufficient_credits``) rather than record a refusal every second.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import IntegrityError, InterfaceError, OperationalError, transaction
from django.db.models import F, QuerySet, TextField, Value, Window
from django.db.models.functions import MD5, Cast, Concat, RowNumber
from django.utils import timezone

from billing import quotas
from billing.models import Organization
from billing.services import InsufficientCredits
from common import metrics
from runs import services as run_services
from runs.admission.run_admission import TooManyPendingRuns
from runs.engine.start import run_start
from runs.models import Run
from runs.plan import DurationRefused, PlanError, PlanInvalid, parse_plan, read_duration_ms
from runs.states import RUN_TERMINAL
from schedules import timing
from schedules.cron import Cron, CronInvalid
from schedules.models import (
    ACTIVE,
    MIN_INTERVAL_MS,
    NAME_MAX_LENGTH,
    Catchup,
    FireKind,
    FireStatus,
    Overlap,
    PausedReason,
    Schedule,
    ScheduleFire,
    SkipReason,
)

logger = logging.getLogger(__name__)

# The earliest and latest start_at and end_at: an anchor anywhere from the Unix epoch
# (align an interval on it) to a date whose due times still fit in a datetime.
EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
LATEST = datetime(3000, 1, 1, tzinfo=UTC)


class ScheduleNotFound(Exception):
    code = "not_found"


@dataclass(frozen=True)
class Problem:
    path: str
    message: str
    code: str


class ScheduleInvalid(Exception):
    """Fields of a schedule that cannot be stored, each with its path and a stable code
    (``invalid_cron``, ``invalid_interval``, ``invalid_timezone``, ...). API: 400
    ``invalid_request``; the plan's own problems are ``PlanInvalid`` (``invalid_plan``)."""

    code = "invalid_request"

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        super().__init__("; ".join(f"{p.path}: {p.message}" for p in problems))


# Fields an update leaves as they are when not given (None is a value: "no end").
UNSET: Any = object()


def _actor_of(schedule: Schedule) -> str:
    return f"schedule:{schedule.pk}"


# --------------------------------------------------------------------------- reading
def lock_schedule(schedule_id: UUID | str, organization: Organization | None = None) -> Schedule:
    """The schedule, locked for the rest of the transaction; scoped to ``organization``."""
    query = Schedule.objects.select_for_update()
    if organization is not None:
        query = query.filter(organization=organization)
    try:
        return query.get(pk=schedule_id)
    except (Schedule.DoesNotExist, ValueError, ValidationError) as exc:
        raise ScheduleNotFound(f"schedule {schedule_id} not found") from exc


def due_times(schedule: Schedule) -> timing.DueTimes:
    """When ``schedule`` is due (its stored fields were checked when they were written)."""
    return timing.DueTimes(
        anchor=schedule.anchor,
        inclusive=schedule.start_at is not None,
        end=schedule.end_at,
        zone=timing.zone_named(schedule.timezone),
        cron=Cron.parse(schedule.cron) if schedule.cron else None,
        interval=(timedelta(milliseconds=schedule.interval_ms) if schedule.interval_ms else None),
    )


def run_plan(schedule: Schedule) -> Any:
    """The plan each run of ``schedule`` gets: its plan with its variables laid over the
    plan's own (a plan that is no object is left as it is, for the validator to refuse)."""
    return _merged(schedule.plan, schedule.variables)


def _merged(plan: Any, variables: dict[str, Any]) -> Any:
    if not variables or not isinstance(plan, dict):
        return plan
    own = plan.get("variables")
    if own is not None and not isinstance(own, dict):
        return plan  # the validator says what is wrong with them
    return {**plan, "variables": {**(own or {}), **variables}}


# --------------------------------------------------------------------------- validation
@dataclass(frozen=True)
class _When:
    cron: str
    interval_ms: int | None
    timezone: str
    start_at: datetime | None
    end_at: datetime | None


def _read_when(when: _When, *, created_at: datetime, now: datetime, new_end: bool) -> None:
    """Every problem of the schedule's timing, at once; then whether any due time is left.
    ``new_end``: ``end_at`` is being set (an end already past is refused only then)."""
    problems: list[Problem] = []
    cron: Cron | None = None
    if not when.cron and when.interval_ms is None:
        problems.append(Problem("cron", "give either cron or interval", "required"))
    if when.cron:
        try:
            cron = Cron.parse(when.cron)
        except CronInvalid as exc:
            problems.append(Problem("cron", str(exc), "invalid_cron"))
        else:
            if not timing.cron_ever_due(cron):
                problems.append(Problem("cron", "matches no date", "invalid_cron"))
    try:
        zone = timing.zone_named(when.timezone)
    except timing.TimezoneInvalid as exc:
        problems.append(Problem("timezone", str(exc), "invalid_timezone"))
    for name, value in (("start_at", when.start_at), ("end_at", when.end_at)):
        if value is not None and not EARLIEST <= value < LATEST:
            problems.append(
                Problem(name, "must be from 1970-01-01 to before 3000-01-01", "out_of_range")
            )
    if when.start_at is not None and when.end_at is not None and when.end_at <= when.start_at:
        problems.append(Problem("end_at", "must be after start_at", "invalid"))
    elif new_end and when.end_at is not None and when.end_at <= now:
        problems.append(Problem("end_at", "must be in the future", "invalid"))
    if problems:
        raise ScheduleInvalid(problems)
    times = timing.DueTimes(
        anchor=when.start_at or created_at,
        inclusive=when.start_at is not None,
        end=when.end_at,
        zone=zone,
        cron=cron,
        interval=timedelta(milliseconds=when.interval_ms) if when.interval_ms else None,
    )
    if times.after(now) is None:
        raise ScheduleInvalid(
            [Problem("end_at", "no due time is left before end_at", "no_due_time")]
        )


def _read_interval(value: Any) -> int:
    try:
        return read_duration_ms(value, minimum_ms=MIN_INTERVAL_MS)
    except DurationRefused as exc:
        raise ScheduleInvalid([Problem("interval", str(exc), "invalid_interval")]) from None


def _read_cadence(cron: str | None, interval: Any) -> tuple[str, int | None]:
    if cron and interval is not None:
        raise ScheduleInvalid([Problem("interval", "give cron or interval, not both", "invalid")])
    if interval is not None:
        return "", _read_interval(interval)
    return cron or "", None


def _read_name(name: Any) -> str:
    text = name.strip() if isinstance(name, str) else ""
    if not text or len(text) > NAME_MAX_LENGTH:
        raise ScheduleInvalid(
            [Problem("name", f"must be 1 to {NAME_MAX_LENGTH} characters", "invalid")]
        )
    return text


def _read_choices(overlap: str, catchup: str) -> None:
    problems = [
        Problem(path, f"must be one of {', '.join(choices.values)}", "invalid_choice")
        for path, value, choices in (("overlap", overlap, Overlap), ("catchup", catchup, Catchup))
        if value not in choices.values
    ]
    if problems:
        raise ScheduleInvalid(problems)


def _check_plan(plan: Any, variables: Any, size_hint: int | None) -> None:
    """The plan as its runs will get it, validated completely; its problems' paths start
    with ``plan.`` (the schedule's body has other fields)."""
    if not isinstance(variables, dict):
        raise ScheduleInvalid([Problem("variables", "must be an object", "invalid")])
    try:
        parse_plan(_merged(plan, variables), size_hint=size_hint)
    except PlanInvalid as exc:
        raise PlanInvalid(
            [
                PlanError(f"plan.{error.path}" if error.path else "plan", error.message)
                for error in exc.errors
            ]
        ) from None


# --------------------------------------------------------------------------- create, edit
def schedules_held(*, organization: Organization) -> QuerySet[Schedule]:
    """The schedules that count against the quota `schedules`: all of them, active,
    paused or ended (an ended one is given a new end by a PATCH)."""
    return Schedule.objects.filter(organization=organization)


@transaction.atomic
def schedule_create(
    *,
    organization: Organization,
    name: str,
    plan: Any,
    cron: str | None = None,
    interval: Any = None,
    timezone_name: str = "UTC",
    start_at: datetime | None = None,
    end_at: datetime | None = None,
    overlap: str = Overlap.SKIP,
    catchup: str = Catchup.NONE,
    variables: dict[str, Any] | None = None,
    actor: str = "system",
    size_hint: int | None = None,
    now: datetime | None = None,
) -> Schedule:
    """Validate everything, then store an active schedule whose first due time is the
    first after now (from ``start_at`` when given). Nothing is stored on a problem:
    ``ScheduleInvalid`` (a field, with its path and code), ``PlanInvalid``, or
    ``QuotaExceeded`` past the organization's quota."""
    now = now or timezone.now()
    name = _read_name(name)
    cron_text, interval_ms = _read_cadence(cron, interval)
    when = _When(cron_text, interval_ms, timezone_name, start_at, end_at)
    _read_when(when, created_at=now, now=now, new_end=True)
    _read_choices(overlap, catchup)
    variables = {} if variables is None else variables
    _check_plan(plan, variables, size_hint)
    quotas.check_quota(
        organization, quotas.SCHEDULES, held=schedules_held(organization=organization)
    )
    schedule = Schedule(
        organization=organization,
        name=name,
        plan=plan,
        variables=variables,
        cron=cron_text,
        interval_ms=interval_ms,
        timezone=timezone_name,
        start_at=start_at,
        end_at=end_at,
        overlap=overlap,
        catchup=catchup,
        created_by=actor,
        created_at=now,
    )
    schedule.next_due_at = due_times(schedule).after(now)
    schedule.save(force_insert=True)
    return schedule


@transaction.atomic
def schedule_update(
    *,
    schedule_id: UUID | str,
    organization: Organization | None = None,
    name: Any = UNSET,
    plan: Any = UNSET,
    variables: Any = UNSET,
    cron: Any = UNSET,
    interval: Any = UNSET,
    timezone_name: Any = UNSET,
    start_at: Any = UNSET,
    end_at: Any = UNSET,
    overlap: Any = UNSET,
    catchup: Any = UNSET,
    size_hint: int | None = None,
    now: datetime | None = None,
) -> Schedule:
    """Change what is given (``UNSET`` leaves a field as it is; ``start_at`` and
    ``end_at`` take None). A new ``cron`` replaces an interval and a new ``interval`` a
    cron. When the timing changes, the next due time is the first after now by the new
    timing: times that passed before the change are not caught up."""
    now = now or timezone.now()
    schedule = lock_schedule(schedule_id, organization)
    if name is not UNSET:
        schedule.name = _read_name(name)
    timing_changed = any(
        value is not UNSET for value in (cron, interval, timezone_name, start_at, end_at)
    )
    if timing_changed:
        if cron is not UNSET or interval is not UNSET:
            schedule.cron, schedule.interval_ms = _read_cadence(
                None if cron is UNSET else cron, None if interval is UNSET else interval
            )
        if timezone_name is not UNSET:
            schedule.timezone = timezone_name
        if start_at is not UNSET:
            schedule.start_at = start_at
        if end_at is not UNSET:
            schedule.end_at = end_at
        when = _When(
            schedule.cron,
            schedule.interval_ms,
            schedule.timezone,
            schedule.start_at,
            schedule.end_at,
        )
        _read_when(when, created_at=schedule.created_at, now=now, new_end=end_at is not UNSET)
        schedule.next_due_at = due_times(schedule).after(now)
    if overlap is not UNSET:
        schedule.overlap = overlap
    if catchup is not UNSET:
        schedule.catchup = catchup
    _read_choices(schedule.overlap, schedule.catchup)
    if plan is not UNSET or variables is not UNSET:
        schedule.plan = schedule.plan if plan is UNSET else plan
        schedule.variables = schedule.variables if variables is UNSET else variables
        _check_plan(schedule.plan, schedule.variables, size_hint)
    schedule.save()
    return schedule


@transaction.atomic
def schedule_delete(*, schedule_id: UUID | str, organization: Organization | None = None) -> None:
    """Remove the schedule and its history of fires; the runs it started stay (they are
    no longer found by ``?schedule=``)."""
    lock_schedule(schedule_id, organization).delete()


@transaction.atomic
def schedule_pause(
    *,
    schedule_id: UUID | str,
    organization: Organization | None = None,
    now: datetime | None = None,
) -> Schedule:
    """Stop firing; due times while paused are neither run nor recorded. Pausing a paused
    schedule changes nothing. Runs already started go on."""
    schedule = lock_schedule(schedule_id, organization)
    if schedule.paused_at is None:
        schedule.paused_at = now or timezone.now()
        schedule.paused_reason = PausedReason.MANUAL
        schedule.save(update_fields=["paused_at", "paused_reason", "updated_at"])
    return schedule


@transaction.atomic
def schedule_resume(
    *,
    schedule_id: UUID | str,
    organization: Organization | None = None,
    now: datetime | None = None,
) -> Schedule:
    """Fire again from the first due time after now (the paused ones are not caught up),
    whoever paused it; its count of refusals for credits starts again from 0. Resuming
    an active schedule changes nothing."""
    schedule = lock_schedule(schedule_id, organization)
    if schedule.paused_at is not None:
        schedule.paused_at, schedule.paused_reason, schedule.credit_refusals = None, "", 0
        schedule.next_due_at = due_times(schedule).after(now or timezone.now())
        schedule.save(
            update_fields=[
                "paused_at", "paused_reason", "credit_refusals", "next_due_at", "updated_at"
            ]
        )  # fmt: skip
    return schedule


@transaction.atomic
def schedule_trigger(
    *,
    schedule_id: UUID | str,
    organization: Organization | None = None,
    actor: str = "system",
    now: datetime | None = None,
) -> ScheduleFire:
    """Run the schedule now, outside its due times, paused or ended as it may be: a
    ``manual`` fire and its run. ``overlap: cancel_previous`` cancels the runs still going
    first; ``skip`` does not hold back a run asked for by name. What refuses the run
    (``InsufficientCredits``, ``TooManyPendingRuns``, ``PlanInvalid``) is raised, and
    nothing is recorded."""
    schedule = lock_schedule(schedule_id, organization)
    fire = ScheduleFire.objects.create(
        schedule=schedule,
        kind=FireKind.MANUAL,
        due_at=now or timezone.now(),
        status=FireStatus.FIRED,
        message=f"triggered by {actor}"[:1000],
    )
    if schedule.overlap == Overlap.CANCEL_PREVIOUS:
        _cancel_previous(schedule, fire)
    fire.run = _start_run(schedule)
    fire.save(update_fields=["run"])
    _credits_were_there(schedule)
    _count(fire)
    return fire


def _count(fire: ScheduleFire, due_times: int = 1) -> None:
    """Count the fire for Prometheus once it is committed (``common.metrics``): by kind,
    and ``fired`` or the reason it was skipped. A fire rolled back is not counted."""
    outcome = fire.reason or str(fire.status)
    kind = str(fire.kind)
    transaction.on_commit(lambda: metrics.schedule_fires(kind, outcome, due_times))


# --------------------------------------------------------------------------- firing
def _active_runs(schedule: Schedule, *, but: ScheduleFire | None = None) -> list[Run]:
    """The schedule's runs that have not ended, oldest first. Fires whose run has ended
    are marked so (``run_ended``) on the way: each check reads only the runs not yet seen
    ended, not the schedule's whole history."""
    fires = ScheduleFire.objects.filter(schedule=schedule, run__isnull=False, run_ended=False)
    if but is not None:
        fires = fires.exclude(pk=but.pk)
    runs = list(
        Run.objects.filter(pk__in=fires.values("run_id"))
        .only("id", "status")
        .order_by("created_at", "id")
    )
    ended = [run.pk for run in runs if run.status in RUN_TERMINAL]
    if ended:
        fires.filter(run_id__in=ended).update(run_ended=True)
    return [run for run in runs if run.status not in RUN_TERMINAL]


def _cancel_previous(schedule: Schedule, fire: ScheduleFire) -> None:
    for run in _active_runs(schedule, but=fire):
        run_services.run_cancel(
            run_id=run.pk,
            reason=f"replaced by the run of schedule {schedule.name!r} due at "
            f"{fire.due_at.isoformat()} (overlap: cancel_previous)",
            actor=_actor_of(schedule),
        )


def _start_run(schedule: Schedule) -> Run:
    """Create and start the schedule's run, as ``POST /runs`` with ``start`` does."""
    actor = _actor_of(schedule)
    run, plan = run_services.run_create_checked(
        organization=schedule.organization, plan=run_plan(schedule), actor=actor
    )
    return run_start(run_id=run.pk, organization=schedule.organization, actor=actor, plan=plan)


# What refuses a scheduled run without anything being wrong with the schedule's code:
# recorded as the skipped fire's reason, and the schedule goes on.
REFUSALS: dict[type[Exception], str] = {
    InsufficientCredits: SkipReason.INSUFFICIENT_CREDITS,
    TooManyPendingRuns: SkipReason.TOO_MANY_PENDING_RUNS,
    PlanInvalid: SkipReason.INVALID_PLAN,
}


def _fire(schedule: Schedule, due_at: datetime) -> ScheduleFire | None:
    """Handle one due time: a fire with its run, or skipped with the reason; None when
    another transaction handled it already (the unique constraint said so)."""
    try:
        with transaction.atomic():
            fire = ScheduleFire.objects.create(
                schedule=schedule,
                kind=FireKind.SCHEDULED,
                due_at=due_at,
                status=FireStatus.FIRED,
            )
    except IntegrityError:
        logger.info("schedule %s: due time %s was fired already", schedule.pk, due_at)
        return None
    if schedule.organization.suspended_at is not None:  # read with the schedule's row
        return _skipped(fire, SkipReason.SUSPENDED, "the organization is suspended")
    previous = _active_runs(schedule, but=fire)
    if previous and schedule.overlap == Overlap.SKIP:
        return _skipped(
            fire,
            SkipReason.OVERLAP,
            f"run {previous[-1].pk} of this schedule is still {previous[-1].status}",
        )
    try:
        # Cancelling the previous runs and starting the new one stand or fall together:
        # a run the credits refuse does not leave the previous ones cancelled for nothing.
        with transaction.atomic():
            if schedule.overlap == Overlap.CANCEL_PREVIOUS:
                _cancel_previous(schedule, fire)
            fire.run = _start_run(schedule)
    except tuple(REFUSALS) as exc:
        reason = next(code for kind, code in REFUSALS.items() if isinstance(exc, kind))
        return _skipped(fire, reason, str(exc))
    fire.save(update_fields=["run"])
    return fire


def _skipped(fire: ScheduleFire, reason: str, message: str) -> ScheduleFire:
    fire.status, fire.reason, fire.message, fire.run = FireStatus.SKIPPED, reason, message, None
    fire.save(update_fields=["status", "reason", "message", "run"])
    logger.info("schedule %s: due time %s skipped: %s", fire.schedule_id, fire.due_at, message)
    return fire


def _record_missed(schedule: Schedule, times: timing.DueTimes, plan: timing.Catchup) -> int:
    """One skipped fire, at the latest missed due time, standing for every missed one (a
    schedule every second with beat down for a day would otherwise write 86,400 rows)."""
    assert plan.missed_first is not None
    assert plan.missed_last is not None
    count = times.count(plan.missed_first, plan.missed_last)
    several = f"{count} due times from {plan.missed_first.isoformat()} to "
    span = f"{several}{plan.missed_last.isoformat()}" if count > 1 else "this due time"
    message = (
        f"{span} passed while no tick ran (beat or the workers were down); "
        f"catchup {schedule.catchup}"
    )
    try:
        with transaction.atomic():
            fire = ScheduleFire.objects.create(
                schedule=schedule,
                kind=FireKind.SCHEDULED,
                due_at=plan.missed_last,
                status=FireStatus.SKIPPED,
                reason=SkipReason.MISSED,
                message=message,
            )
    except IntegrityError:
        return 0
    _count(fire, due_times=count)
    return count


@transaction.atomic
def schedule_fire_due(*, schedule_id: UUID | str, now: datetime | None = None) -> Counter[str]:
    """Handle the due times of one schedule up to now, by its catch-up policy, and move
    ``next_due_at`` past now. Does nothing when the schedule is held by another
    transaction (the next tick takes it), paused, or not due."""
    now = now or timezone.now()
    schedule = (
        Schedule.objects.select_for_update(skip_locked=True)
        .select_related("organization")
        .filter(pk=schedule_id, paused_at__isnull=True, next_due_at__lte=now)
        .first()
    )
    counts: Counter[str] = Counter()
    if schedule is None:
        return counts
    assert schedule.next_due_at is not None
    times = due_times(schedule)
    plan = timing.plan_catchup(
        times,
        first=schedule.next_due_at,
        now=now,
        policy=schedule.catchup,
        grace=timedelta(seconds=settings.SCHEDULES_MISFIRE_GRACE),
        bound=settings.SCHEDULES_CATCHUP_MAX,
    )
    if plan.missed_last is not None:
        counts["missed"] += _record_missed(schedule, times, plan)
    for due_at in plan.fire:
        fire = _fire(schedule, due_at)
        if fire is not None:
            _tally_credits(schedule, fire, now)
            counts[fire.status] += 1
            _count(fire)
        if schedule.paused_at is not None:
            break  # it paused itself: the due times left are not fired
    if plan.latest is not None:
        schedule.last_due_at = plan.latest
    schedule.next_due_at = times.after(now)
    schedule.save(
        update_fields=[
            "last_due_at", "next_due_at", "credit_refusals", "paused_at", "paused_reason",
            "updated_at",
        ]
    )  # fmt: skip
    return counts


def _tally_credits(schedule: Schedule, fire: ScheduleFire, now: datetime) -> None:
    """A run started sets the count of refusals for credits back to 0; one more refusal
    counts, and the SCHEDULES_PAUSE_AFTER_CREDIT_REFUSALS-th in a row pauses the schedule
    (``paused_reason: insufficient_credits``), until someone resumes it. Other skips
    (overlap, pending runs, the plan) leave the count as it is. The caller saves."""
    if fire.status == FireStatus.FIRED:
        schedule.credit_refusals = 0
        return
    if fire.reason != SkipReason.INSUFFICIENT_CREDITS:
        return
    schedule.credit_refusals += 1
    most = settings.SCHEDULES_PAUSE_AFTER_CREDIT_REFUSALS
    if schedule.credit_refusals < most:
        return
    schedule.paused_at, schedule.paused_reason = now, PausedReason.INSUFFICIENT_CREDITS
    fire.message = f"{fire.message}; paused after {most} refusals for credits in a row"[:1000]
    fire.save(update_fields=["message"])
    logger.warning(
        "schedule %s paused itself: its runs were refused for credits %d times in a row",
        schedule.pk,
        most,
    )


def _credits_were_there(schedule: Schedule) -> None:
    if schedule.credit_refusals:
        schedule.credit_refusals = 0
        schedule.save(update_fields=["credit_refusals", "updated_at"])


def schedules_fire_due(*, now: datetime | None = None, batch: int | None = None) -> dict[str, int]:
    """The beat tick: at most ``batch`` (SCHEDULES_TICK_MAX) of the schedules due by
    now, organizations served round robin (``due_in_turn``), each schedule in its own
    transaction (one schedule's trouble neither rolls back nor holds up another's
    fires). More due: the next tick, beat's next look (SCHEDULES_TICK_SECONDS) finding
    them due. Returns counts by outcome (``fired``, ``skipped``, ``missed``, ``errors``).

    Not one transaction on purpose: a tick over many schedules would hold their locks
    until the last one was done. A database outage ends the tick (the task retries it);
    anything else failing one schedule is logged and the tick goes on."""
    now = now or timezone.now()
    counts: Counter[str] = Counter()
    for schedule_id in due_in_turn(now=now, batch=batch or settings.SCHEDULES_TICK_MAX):
        try:
            counts.update(schedule_fire_due(schedule_id=schedule_id, now=now))
        except (OperationalError, InterfaceError):
            raise
        except Exception:  # one broken schedule must not stop the others
            logger.exception("schedule %s could not be fired", schedule_id)
            counts["errors"] += 1
            metrics.schedule_fires(str(FireKind.SCHEDULED), "error")
    return dict(counts)


def due_in_turn(*, now: datetime, batch: int) -> list[UUID]:
    """At most ``batch`` of the schedules due by ``now``, in one statement, organizations
    in turn: every organization's most overdue schedule first (the longest overdue of
    them first), then every organization's second, and so on. So one organization's
    thousands of due schedules take one place per round, not the tick. Organizations
    whose turns are alike (due at the same moment, as `* * * * *` crons are) come in an
    order that changes with every tick (a hash of the organization and the tick's
    moment), so that none is always the last when the batch runs out."""
    turn = Window(
        RowNumber(),
        partition_by=[F("organization_id")],
        order_by=[F("next_due_at").asc(), F("id").asc()],
    )
    shuffle = MD5(Concat(Cast("organization_id", TextField()), Value(now.isoformat())))
    due = (
        Schedule.objects.filter(ACTIVE, next_due_at__lte=now)
        .annotate(turn=turn, shuffle=shuffle)
        .order_by("turn", "next_due_at", "shuffle")
        .values_list("pk", flat=True)
    )
    return list(due[:batch])
