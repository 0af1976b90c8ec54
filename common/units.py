"""Durations and times as people read them, in one place: every screen an operator reads
(the admin, messages about limits) says ``5 s``, ``1 min``, ``1 h 30 min``, never
``5000`` or ``3600000 ms``, and every time it shows carries its zone.

Plans and the API keep their own forms (``runs.plan.durations``: ``"30s"``, ``"1h"``,
and ISO 8601 times with their offset): those are read back by programs. Pure Python, no
Django.
"""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

__all__ = ["duration_text", "time_in_zone"]

# Largest first: a duration is written in the largest unit it holds.
UNITS = (("d", 86_400_000), ("h", 3_600_000), ("min", 60_000), ("s", 1000), ("ms", 1))


def duration_text(ms: int) -> str:
    """``ms`` milliseconds in the largest unit it holds: ``5 s``, ``1 min``, ``1 h``,
    ``2 d``, ``250 ms``; with the next unit when it is not a whole one (``1 h 30 min``,
    ``1 min 30 s``), and seconds with their fraction (``1.5 s``)."""
    if ms < 0:
        return f"-{duration_text(-ms)}"
    if ms == 0:
        return "0 s"
    index = next(i for i, (_, size) in enumerate(UNITS) if ms >= size)
    name, size = UNITS[index]
    whole, rest = divmod(ms, size)
    if rest == 0:
        return f"{whole} {name}"
    if name == "s":
        return f"{ms / 1000:g} s"
    return f"{whole} {name} {duration_text(rest)}"


def time_in_zone(when: datetime | None, zone: str = "UTC", *, seconds: bool = False) -> str:
    """An aware ``when`` as read in ``zone`` (an IANA name), the zone written after it:
    ``2026-11-28 01:30 Europe/Paris``; ``-`` for none. A zone this machine does not know
    is read as UTC, and labelled so."""
    if when is None:
        return "-"
    try:
        info, label = ZoneInfo(zone), zone
    except (ZoneInfoNotFoundError, ValueError):
        info, label = ZoneInfo("UTC"), "UTC"
    shown = when.astimezone(info)
    written = f"{shown:%Y-%m-%d %H:%M:%S}" if seconds else f"{shown:%Y-%m-%d %H:%M}"
    return f"{written} {label}"
