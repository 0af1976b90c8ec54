"""Durations as plans write them (``"250ms"``, ``"30s"``, ``"1.5h"``, ``"7d"``, or a
number of seconds), in whole milliseconds.

The one reading of every duration a plan holds: its own ``timeout``s, ``timeouts`` and
``escalation.window`` (``runs.plan.fields.Duration``) and the tools' duration parameters
(``match_timeout``, ``interval``, ``timeout``: ``orchestrator.tools``), so that each takes
the same forms and a refusal reads the same wherever it is. A parameter whose name
carries its unit (``sleep``'s ``seconds``, ``*_ms``) is a number, not a duration.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal
from typing import Any

from runs.plan.errors import show

# At most 15 integer digits: anything longer is no duration, and must not cost a huge
# number conversion to refuse.
DURATION_RE = re.compile(r"\s*([0-9]{1,15}(?:\.[0-9]{1,9})?)\s*(ms|s|m|h|d)\s*")
DURATION_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
# No timeout may exceed this: larger values overflow date arithmetic further on.
MAX_DURATION_MS = 365 * DURATION_UNITS_MS["d"]
# The longest `wait` step: a year and a day, so that "the same date next year" always fits.
WAIT_MAX_MS = 366 * DURATION_UNITS_MS["d"]
# The forms, as refusals quote them and as the OpenAPI schema describes them.
DURATION_FORMS = "'250ms', '30s', '5m', '1.5h', '7d' or a number of seconds"
DURATION_HELP = "A duration such as `250ms`, `30s`, `5m`, `1.5h`, `7d`, or seconds."


class DurationRefused(ValueError):
    """A value that is no duration within its bounds; the text says why, as a plan's
    problem (``must be at most 1d, got '2d'``), to follow the field's path."""


def parse_duration_ms(value: Any) -> int | None:
    """``"30s"``, ``"250ms"``, ``"1.5h"``, ``"7d"``, or a number of seconds, in whole
    milliseconds; None unless it is at least 1ms. Never raises."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        ms = value * 1000
    elif isinstance(value, float):
        if not math.isfinite(value):
            return None
        ms = int(Decimal(value) * 1000)  # exact: no float rounding, no overflow
    elif isinstance(value, str):
        match = DURATION_RE.fullmatch(value)
        if not match:
            return None
        ms = int(Decimal(match.group(1)) * DURATION_UNITS_MS[match.group(2)])
    else:
        return None
    return ms if ms > 0 else None


def read_duration_ms(value: Any, *, minimum_ms: int = 1, maximum_ms: int = MAX_DURATION_MS) -> int:
    """``value`` (``parse_duration_ms``'s forms) in whole milliseconds, from
    ``minimum_ms`` to ``maximum_ms`` (never beyond a year), or ``DurationRefused``."""
    ms = parse_duration_ms(value)
    if ms is None:
        raise DurationRefused(not_a_duration(value))
    maximum_ms = min(maximum_ms, MAX_DURATION_MS)
    if minimum_ms <= ms <= maximum_ms:
        return ms
    # The value is shown only when refused: a plan may hold thousands of durations.
    if ms < minimum_ms:
        raise DurationRefused(
            f"must be at least {format_duration_ms(minimum_ms)}, got {show(value)}"
        )
    raise DurationRefused(f"must be at most {format_duration_ms(maximum_ms)}, got {show(value)}")


def not_a_duration(value: Any) -> str:
    """The refusal of a value that is no duration at all."""
    return f"must be a duration of at least 1ms such as {DURATION_FORMS}, got {show(value)}"


def seconds_ms(seconds: float) -> int:
    """A bound given in seconds (a setting such as ``POLL_MIN_INTERVAL``) in whole
    milliseconds, as durations are compared."""
    return round(seconds * 1000)


def format_duration_ms(ms: int) -> str:
    """The largest unit that divides ``ms`` exactly: ``3_600_000`` is ``"1h"``."""
    for unit in ("d", "h", "m", "s"):
        if ms % DURATION_UNITS_MS[unit] == 0:
            return f"{ms // DURATION_UNITS_MS[unit]}{unit}"
    return f"{ms}ms"
