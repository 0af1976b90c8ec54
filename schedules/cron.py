"""Cron expressions, as crontab(5) writes them: five fields, read strictly.

    minute  hour  day-of-month  month      day-of-week
    0-59    0-23  1-31          1-12, jan  0-7 (0 and 7: Sunday), sun

Each field is a comma-separated list of ``*``, ``N``, ``N-M``, any of them with a
``/STEP``, or (month, day of week) a name. ``7`` is Sunday, as ``0`` is. ``@yearly``
(``@annually``), ``@monthly``, ``@weekly``, ``@daily`` (``@midnight``) and ``@hourly``
stand for their usual five fields.

Day of month and day of week combine as Vixie cron combines them: when either field
starts with ``*``, a day must match both; when neither does, a day matching either is
enough (``0 9 1 * mon``: the 1st of the month and every Monday).

Parsing is the only thing here; when a cron is due, in a time zone, is
``schedules.timing``. Nothing is taken from Celery's ``crontab``: it wraps reversed
ranges round (``5-2``), refuses ``7`` for Sunday and has no OR of the two day fields.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date

MAX_LENGTH = 200
MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
WEEKDAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")


class CronInvalid(ValueError):
    """Not a cron expression; the text says which field and why."""


@dataclass(frozen=True)
class _Field:
    name: str
    low: int
    high: int
    names: dict[str, int]


_FIELDS = (
    _Field("minute", 0, 59, {}),
    _Field("hour", 0, 23, {}),
    _Field("day of month", 1, 31, {}),
    _Field("month", 1, 12, {name: number for number, name in enumerate(MONTHS, start=1)}),
    # 7 is Sunday too; folded into 0 once read.
    _Field("day of week", 0, 7, {name: number for number, name in enumerate(WEEKDAYS)}),
)


@dataclass(frozen=True)
class Cron:
    """A parsed cron expression: the values each field allows, in ascending order."""

    text: str
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 is Sunday
    # Whether the day fields start with `*` (Vixie cron's DOM_STAR and DOW_STAR).
    any_day: bool
    any_weekday: bool

    @classmethod
    def parse(cls, text: str) -> Cron:
        """``text`` read, or ``CronInvalid`` saying what is wrong with it."""
        if not isinstance(text, str):
            raise CronInvalid("must be a string such as '*/15 * * * *'")
        if len(text) > MAX_LENGTH:
            raise CronInvalid(f"must be at most {MAX_LENGTH} characters")
        written = text.strip()
        expanded = MACROS.get(written.lower(), written)
        if expanded.startswith("@"):
            raise CronInvalid(f"unknown macro {written!r}; known: {', '.join(sorted(MACROS))}")
        parts = expanded.split()
        if len(parts) != len(_FIELDS):
            raise CronInvalid(
                f"must have 5 fields (minute hour day-of-month month day-of-week), got {len(parts)}"
            )
        values = [_read_field(part, field) for part, field in zip(parts, _FIELDS, strict=True)]
        minutes, hours, days, months, weekdays = values
        return cls(
            text=written,
            minutes=tuple(sorted(minutes)),
            hours=tuple(sorted(hours)),
            days=frozenset(days),
            months=frozenset(months),
            weekdays=frozenset(day % 7 for day in weekdays),
            any_day=parts[2].startswith("*"),
            any_weekday=parts[4].startswith("*"),
        )

    def matches_day(self, day: date) -> bool:
        """Whether the cron runs at all on ``day`` (a calendar date, wherever it is)."""
        if day.month not in self.months:
            return False
        by_date = day.day in self.days
        by_weekday = day.isoweekday() % 7 in self.weekdays
        if self.any_day or self.any_weekday:
            return by_date and by_weekday
        return by_date or by_weekday


def _read_field(text: str, field: _Field) -> set[int]:
    values: set[int] = set()
    for item in text.split(","):
        if not item:
            raise CronInvalid(f"{field.name}: empty item in {text!r}")
        base, slash, step_text = item.partition("/")
        step = 1
        if slash:
            if (
                not (step_text.isascii() and step_text.isdigit())
                or not 1 <= int(step_text) <= field.high
            ):
                raise CronInvalid(
                    f"{field.name}: step {step_text!r} is not a number from 1 to {field.high}"
                )
            step = int(step_text)
        if base == "*":
            low, high = field.low, min(field.high, 6) if field.name == "day of week" else field.high
        elif "-" in base:
            first, _, last = base.partition("-")
            low, high = _value(first, field), _value(last, field)
            if low > high:
                raise CronInvalid(f"{field.name}: range {base!r} runs backwards")
        else:
            low = _value(base, field)
            # `N/STEP`: from N to the field's end, every STEP.
            high = field.high if slash else low
        values.update(range(low, high + 1, step))
    return values


def _value(token: str, field: _Field) -> int:
    lowered = token.lower()
    if lowered in field.names:
        return field.names[lowered]
    if token.isascii() and token.isdigit() and field.low <= int(token) <= field.high:
        return int(token)
    names = f" or a name ({', '.join(field.names)})" if field.names else ""
    raise CronInvalid(
        f"{field.name}: {token!r} is not a number from {field.low} to {field.high}{names}"
    )
