"""The sliding window: when units may be granted, and granting them.

In ANY window of length ``period`` a bucket grants at most ``limit`` units (a token
bucket lets twice the limit through around a refill; this does not). Each bucket's
grants are rows (``RateGrant``); asking is done under the bucket's advisory lock, in the
caller's transaction, so many workers at once see one state.

A step asks at the back of the line: never before the bucket's last grant (past or
reserved), at the earliest moment ``t`` such that the units granted in ``(t - period, t]``
plus its own fit in the limit. Every grant made is then the latest of its bucket, so the
window ending at it is the only one it can overfill, and that one was checked: every
window holds at most the limit, whatever the order of asks. A ``t`` in the future is a
reservation: the step waits for it (``runs.admission.step_admission``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import connection

from ratelimits.models import RateGrant

# Advisory lock namespace of the buckets ("rate").
LOCK_NAMESPACE = 0x7261_7465


@dataclass(frozen=True)
class Ask:
    """``units`` of ``bucket``, under a limit of ``limit`` per ``period_ms``."""

    bucket: str
    limit_id: Any
    name: str  # the limit's name, as the step shows it waits for it
    limit: int
    period_ms: int
    units: int


@dataclass(frozen=True)
class Asker:
    """Who asks: a step's wait (its place in line: its organization's turn, then
    ``priority`` and ``queued_at`` within the organization: runs.admission.step_admission)."""

    step_id: int | None
    run_id: Any
    priority: int
    queued_at: datetime
    organization_id: Any = None


def lock(buckets: Iterable[str]) -> None:
    """The buckets' locks, in one order (two askers of the same two never deadlock)."""
    with connection.cursor() as cursor:
        for bucket in sorted(set(buckets)):
            cursor.execute(
                "SELECT pg_advisory_xact_lock(%s, hashtext(%s))", [LOCK_NAMESPACE, bucket]
            )


def clock() -> datetime:
    """The database's clock, read now (not the transaction's start): every worker's
    grants are stamped by the one clock, in the order their locks were taken."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        (now,) = cursor.fetchone()
    return now  # type: ignore[no-any-return]


def earliest(ask: Ask, not_before: datetime) -> datetime:
    """The earliest moment from ``not_before`` on (and not before the bucket's last
    grant) at which ``ask`` fits its window. Call it holding the bucket's lock."""
    period = timedelta(milliseconds=ask.period_ms)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT max(granted_at) FROM ratelimits_rategrant WHERE bucket = %s", [ask.bucket]
        )
        (tail,) = cursor.fetchone()
        at = max(not_before, tail) if tail is not None else not_before
        cursor.execute(
            "SELECT granted_at, units FROM ratelimits_rategrant"
            " WHERE bucket = %s AND granted_at > %s ORDER BY granted_at, id",
            [ask.bucket, at - period],
        )
        inside = cursor.fetchall()
    held = sum(units for _, units in inside)
    # Later moments leave the oldest grants behind: at their time + period, each leaves.
    for granted_at, units in inside:
        if held + ask.units <= ask.limit:
            break
        at = max(at, granted_at + period)
        held -= units
    return at


def reserve(
    asks: Sequence[Ask], asker: Asker, now: datetime, *, used: bool
) -> tuple[datetime, Ask]:
    """Grant every ask at one moment, the earliest that fits them all (locks taken here);
    return it and the ask that set it (what the step waits for). ``used``: the caller
    takes the units at once (the moment is ``now``)."""
    lock(ask.bucket for ask in asks)
    at, binding = now, asks[0]
    while True:
        moved = False
        for ask in asks:
            fits = earliest(ask, at)
            if fits > at:
                at, binding, moved = fits, ask, True
        if not moved:
            break
    RateGrant.objects.bulk_create(
        RateGrant(
            bucket=ask.bucket,
            limit_id=ask.limit_id,
            units=ask.units,
            granted_at=at,
            queued_at=asker.queued_at,
            priority=asker.priority,
            step_id=asker.step_id,
            run_id=asker.run_id,
            organization_id=asker.organization_id,
            used=used and at <= now,
        )
        for ask in asks
    )
    return at, binding


def take(grants: Sequence[RateGrant]) -> None:
    RateGrant.objects.filter(pk__in=[grant.pk for grant in grants]).update(used=True)


def forget(grants: Sequence[RateGrant]) -> None:
    """Reservations given back (their step will not run then): their units free again."""
    RateGrant.objects.filter(pk__in=[grant.pk for grant in grants], used=False).delete()


def prune(older_than: datetime, batch: int = 10_000) -> int:
    """Delete grants no window can count any more (older than the longest period)."""
    ids = list(
        RateGrant.objects.filter(granted_at__lt=older_than).values_list("pk", flat=True)[:batch]
    )
    RateGrant.objects.filter(pk__in=ids).delete()
    return len(ids)
