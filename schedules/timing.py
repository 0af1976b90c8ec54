"""When a schedule is due, and what a tick fires when it comes late. Pure functions: the
clock is an argument, so tests set it (tests/schedules/test_timing.py).

**Due times come from the schedule's own anchor**, never from when beat last ran:

- an interval schedule is due at ``anchor + k * interval`` (elapsed time, whatever the
  clocks on the wall do), ``anchor`` being ``start_at``, or ``created_at`` when there is
  none;
- a cron schedule is due at every wall-clock minute its fields match, in its time zone,
  from the anchor on.

``start_at`` is itself a due time of an interval schedule (the first); ``created_at`` is
not (the first is one interval later). Nothing is due after ``end_at``.

**Daylight saving time** (cron only: an interval is elapsed time). A wall-clock time the
clocks skip (02:30 on the spring-forward day in America/New_York) is due once, at the
first instant after the gap (03:00 EDT): several skipped times collapse into that one
instant. A wall-clock time that happens twice (01:30 on the fall-back day) is due once,
at its first occurrence (01:30 EDT); the second pass through that hour runs nothing a
first pass ran. The mapping from wall-clock time to instant is monotonic, which is what
lets ``after`` and ``at_or_before`` scan wall-clock candidates in order.
"""

from __future__ import annotations

import zoneinfo
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from functools import cache

from schedules.cron import Cron

ONE = timedelta(microseconds=1)
# How far a scan for a cron's next (or previous) day goes: the rarest dates a cron can
# name (29 February on a given weekday) recur within 40 years, the 2100 gap included.
SCAN_DAYS = 41 * 366
# More than any change of a time zone's clocks (they went back 2 hours at most).
MAX_SHIFT = timedelta(hours=3)


class TimezoneInvalid(ValueError):
    pass


@cache
def _zone_names() -> frozenset[str]:
    return frozenset(zoneinfo.available_timezones())


def zone_named(name: str) -> zoneinfo.ZoneInfo:
    """The IANA time zone ``name`` (``Europe/Paris``, ``UTC``), or ``TimezoneInvalid``."""
    if not isinstance(name, str) or name not in _zone_names():
        raise TimezoneInvalid(
            f"{name!r} is not an IANA time zone name such as 'UTC' or 'Europe/Paris'"
        )
    return zoneinfo.ZoneInfo(name)


def wall_clock(instant: datetime, zone: zoneinfo.ZoneInfo) -> datetime:
    """The naive wall-clock time ``instant`` shows in ``zone``."""
    return instant.astimezone(zone).replace(tzinfo=None)


def local_instant(wall: datetime, zone: zoneinfo.ZoneInfo) -> datetime:
    """The instant (UTC) at which the naive wall-clock time ``wall`` is due in ``zone``:
    its first occurrence when it happens twice; the first instant after the gap when the
    clocks skip it."""
    first = wall.replace(tzinfo=zone, fold=0).astimezone(UTC)
    if wall_clock(first, zone) == wall:
        return first  # exists (fold 0: the first of two occurrences)
    # In a gap (PEP 495): fold=1 reads it with the offset after the change, an instant
    # before the change; fold=0 with the offset before, an instant after. The change is
    # the first instant whose wall-clock time is not before ``wall``; offsets change on
    # whole seconds.
    low = wall.replace(tzinfo=zone, fold=1).astimezone(UTC)
    high = first
    while high - low > timedelta(seconds=1):
        middle = low + timedelta(seconds=(high - low) // timedelta(seconds=2))
        if wall_clock(middle, zone) >= wall:
            high = middle
        else:
            low = middle
    return high


# --------------------------------------------------------------------------- cron
def cron_after(
    cron: Cron, zone: zoneinfo.ZoneInfo, after: datetime, *, scan_days: int = SCAN_DAYS
) -> datetime | None:
    """The first instant strictly after ``after`` at which ``cron`` is due in ``zone``."""
    start = wall_clock(after, zone).replace(second=0, microsecond=0)
    day: date | None = start.date()
    for _ in range(scan_days):
        if day is None:
            return None
        if cron.matches_day(day):
            for hour in cron.hours:
                for minute in cron.minutes:
                    wall = datetime.combine(day, time(hour, minute))
                    if wall < start:
                        continue
                    instant = local_instant(wall, zone)
                    if instant > after:
                        return instant
        day = _next_day(day, 1)
    return None


def cron_at_or_before(
    cron: Cron,
    zone: zoneinfo.ZoneInfo,
    at: datetime,
    *,
    floor: datetime | None = None,
) -> datetime | None:
    """The last instant at or before ``at`` at which ``cron`` is due in ``zone``; None
    when there is none after ``floor`` (or within the scan)."""
    # A wall-clock time a little after ``at``'s may still be due before it (the first
    # pass of an hour the clocks repeat, ``at`` being in the second): start later by more
    # than any change of the clocks, and let the instants decide.
    top = wall_clock(at, zone) + MAX_SHIFT
    bottom = wall_clock(floor, zone).date() - timedelta(days=1) if floor is not None else None
    day: date | None = top.date()
    for _ in range(SCAN_DAYS):
        if day is None or (bottom is not None and day < bottom):
            return None
        if cron.matches_day(day):
            for hour in reversed(cron.hours):
                for minute in reversed(cron.minutes):
                    wall = datetime.combine(day, time(hour, minute))
                    if wall > top:
                        continue
                    instant = local_instant(wall, zone)
                    if instant <= at:
                        return instant
        day = _next_day(day, -1)
    return None


def _next_day(day: date, step: int) -> date | None:
    try:
        return day + timedelta(days=step)
    except OverflowError:
        return None


def cron_ever_due(cron: Cron) -> bool:
    """Whether any calendar day matches (``0 0 30 2 *`` never does)."""
    return cron_after(cron, zoneinfo.ZoneInfo("UTC"), datetime(2000, 1, 1, tzinfo=UTC)) is not None


# --------------------------------------------------------------------------- due times
@dataclass(frozen=True)
class DueTimes:
    """A schedule's due times: a cron in ``zone``, or every ``interval`` from ``anchor``;
    none before ``anchor`` (the anchor itself only when ``inclusive``), none after
    ``end``."""

    anchor: datetime
    inclusive: bool
    end: datetime | None
    zone: zoneinfo.ZoneInfo
    cron: Cron | None = None
    interval: timedelta | None = None

    def __post_init__(self) -> None:
        if (self.cron is None) == (self.interval is None):
            raise ValueError("a schedule is due by a cron or by an interval, never both")

    def _admits(self, instant: datetime) -> bool:
        if instant < self.anchor or (instant == self.anchor and not self.inclusive):
            return False
        return self.end is None or instant <= self.end

    def after(self, moment: datetime) -> datetime | None:
        """The first due time strictly after ``moment``; None when none is left."""
        floor = self.anchor - ONE if self.inclusive else self.anchor
        moment = max(moment, floor)
        try:
            if self.interval is not None:
                steps = (moment - self.anchor) // self.interval + 1
                found: datetime | None = self.anchor + steps * self.interval
            else:
                assert self.cron is not None
                found = cron_after(self.cron, self.zone, moment)
        except OverflowError:
            return None
        return found if found is not None and self._admits(found) else None

    def at_or_before(self, moment: datetime) -> datetime | None:
        """The last due time at or before ``moment``; None when there is none."""
        if self.end is not None:
            moment = min(moment, self.end)
        if moment < self.anchor:
            return None
        try:
            if self.interval is not None:
                found: datetime | None = (
                    self.anchor + ((moment - self.anchor) // self.interval) * self.interval
                )
            else:
                assert self.cron is not None
                found = cron_at_or_before(self.cron, self.zone, moment, floor=self.anchor)
        except OverflowError:
            return None
        return found if found is not None and self._admits(found) else None

    def count(self, first: datetime, last: datetime, *, cap: int = 10_000) -> int:
        """How many due times from ``first`` to ``last`` (both due times), at most
        ``cap`` (a cron is counted by walking it)."""
        if last < first:
            return 0
        if self.interval is not None:
            return min(cap, (last - first) // self.interval + 1)
        seen = 0
        current: datetime | None = first
        while current is not None and current <= last and seen < cap:
            seen += 1
            current = self.after(current)
        return seen


# --------------------------------------------------------------------------- catch-up
@dataclass(frozen=True)
class Catchup:
    """What a tick does with the due times waiting since the last one it handled."""

    fire: tuple[datetime, ...]  # oldest first
    missed_first: datetime | None  # the due times not fired, from ... to ...
    missed_last: datetime | None
    latest: datetime | None  # the last due time at or before now: handled from now on


NONE, LATEST, ALL = "none", "latest", "all"


def plan_catchup(
    times: DueTimes,
    *,
    first: datetime,
    now: datetime,
    policy: str,
    grace: timedelta,
    bound: int,
) -> Catchup:
    """The due times from ``first`` (the oldest not handled yet) to ``now``, split into
    those to fire and those missed, by the schedule's catch-up policy:

    - ``none``: only the latest, and only when it is at most ``grace`` old (a tick is
      late by a second or two; beat down for an hour is not that); the rest are missed;
    - ``latest``: the latest, however old; the rest are missed;
    - ``all``: every one, oldest first, at most the ``bound`` latest; older ones missed.
    """
    latest = times.at_or_before(now)
    if latest is None or latest < first:
        return Catchup(fire=(), missed_first=None, missed_last=None, latest=None)
    if policy == ALL:
        fire: list[datetime] = []
        current: datetime | None = latest
        while current is not None and current >= first and len(fire) < bound:
            fire.append(current)
            current = times.at_or_before(current - ONE)
        fire.reverse()
    elif policy == LATEST or now - latest <= grace:
        fire = [latest]
    else:
        fire = []
    before = times.at_or_before(fire[0] - ONE) if fire else latest
    missed = before is not None and before >= first
    return Catchup(
        fire=tuple(fire),
        missed_first=first if missed else None,
        missed_last=before if missed else None,
        latest=latest,
    )
