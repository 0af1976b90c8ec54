"""Durations as plans write them (``"250ms"``, ``"30s"``, ``"1.5h"``, ``"7d"``, or a
number of seconds), in whole milliseconds."""

from __future__ import annotations

import math
import re
from decimal import Decimal
from typing import Any

# At most 15 integer digits: anything longer is no duration, and must not cost a huge
# number conversion to refuse.
DURATION_RE = re.compile(r"\s*([0-9]{1,15}(?:\.[0-9]{1,9})?)\s*(ms|s|m|h|d)\s*")
DURATION_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
# No timeout may exceed this: larger values overflow date arithmetic further on.
MAX_DURATION_MS = 365 * DURATION_UNITS_MS["d"]


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


def format_duration_ms(ms: int) -> str:
    """The largest unit that divides ``ms`` exactly: ``3_600_000`` is ``"1h"``."""
    for unit in ("d", "h", "m", "s"):
        if ms % DURATION_UNITS_MS[unit] == 0:
            return f"{ms // DURATION_UNITS_MS[unit]}{unit}"
    return f"{ms}ms"
