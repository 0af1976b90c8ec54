"""Schedules with a clock the test sets: every service takes ``now``."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from billing.models import Organization
from schedules import services
from schedules.models import Schedule
from tests import factories

# The moment every test's schedules are created at.
T0 = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)


def scheduled_plan(**extra: Any) -> dict[str, Any]:
    return factories.plan(name="scheduled", steps=1, **extra)


def make_schedule(organization: Organization | None = None, **fields: Any) -> Schedule:
    """A schedule created at T0, every minute unless ``fields`` say otherwise."""
    if "cron" not in fields and "interval" not in fields:
        fields["interval"] = "1m"
    fields.setdefault("name", "every-minute")
    fields.setdefault("plan", scheduled_plan())
    fields.setdefault("now", T0)
    return services.schedule_create(organization=organization or factories.org(), **fields)
