"""The tick with thousands of schedules due at once: it handles a bounded batch, in a
bounded number of statements whatever the number due, and organizations take turns
(schedules.services.schedules_fire_due, due_in_turn)."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from billing.models import Organization
from schedules import services
from schedules.models import Schedule, ScheduleFire
from tests import factories
from tests.schedules.conftest import T0, scheduled_plan

pytestmark = pytest.mark.django_db

DUE = T0 + timedelta(minutes=1)


def due_schedules(organization: Organization, count: int, due: Any = DUE) -> list[Schedule]:
    """``count`` schedules of ``organization`` every minute, all due at ``due``
    (written at once: the tick is what is measured, not the creation)."""
    plan = scheduled_plan()
    return Schedule.objects.bulk_create(
        Schedule(
            organization=organization,
            name=f"s{n}",
            plan=plan,
            interval_ms=60_000,
            overlap="allow",
            created_at=T0,
            next_due_at=due,
        )
        for n in range(count)
    )


def fired_by_organization() -> Counter[Any]:
    return Counter(
        ScheduleFire.objects.values_list("schedule__organization_id", flat=True).order_by("id")
    )


def test_three_thousand_due_schedules_a_tick_handles_a_batch_organizations_in_turn(
    settings: Any,
) -> None:
    settings.SCHEDULES_TICK_MAX = 60
    organizations = [factories.org() for _ in range(30)]
    for organization in organizations:
        due_schedules(organization, 100)
    # What firing one schedule costs, measured on one more organization's.
    lone = factories.org()
    (measured,) = due_schedules(lone, 1)
    with CaptureQueriesContext(connection) as one:
        services.schedule_fire_due(schedule_id=measured.pk, now=DUE)
    ScheduleFire.objects.all().delete()

    with CaptureQueriesContext(connection) as tick:
        counts = services.schedules_fire_due(now=DUE)

    assert counts == {"fired": 60}
    # Every organization twice (30 x 2), the lone one's done already: the 3,000 due are
    # read by one statement of the batch's size, not walked through.
    assert fired_by_organization() == {organization.pk: 2 for organization in organizations}
    assert len(tick.captured_queries) <= 1 + 60 * (len(one.captured_queries) + 2)
    # In turn: each organization's first before any second.
    order = list(
        ScheduleFire.objects.order_by("id").values_list("schedule__organization_id", flat=True)
    )
    assert len(set(order[:30])) == 30
    assert Schedule.objects.filter(next_due_at__lte=DUE).count() == 3000 - 60


def test_one_organizations_thousands_due_take_one_place_per_round(settings: Any) -> None:
    settings.SCHEDULES_TICK_MAX = 10
    flood, small = factories.org(), factories.org()
    due_schedules(flood, 2000, due=DUE - timedelta(seconds=30))  # due for longer
    due_schedules(small, 3)

    services.schedules_fire_due(now=DUE)

    fired = fired_by_organization()
    assert fired[small.pk] == 3
    assert fired[flood.pk] == 7


def test_organizations_alike_take_turns_from_tick_to_tick(settings: Any) -> None:
    """More organizations due than a tick's batch, all due at the same moment: each
    tick's order changes, so that no organization waits for every other's schedules."""
    settings.SCHEDULES_TICK_MAX = 5
    organizations = [factories.org() for _ in range(20)]
    for organization in organizations:
        due_schedules(organization, 10)

    served: list[set[Any]] = []
    for second in range(4):
        before = set(ScheduleFire.objects.values_list("id", flat=True))
        services.schedules_fire_due(now=DUE + timedelta(seconds=second))
        fresh = ScheduleFire.objects.exclude(id__in=before)
        served.append(set(fresh.values_list("schedule__organization_id", flat=True)))

    assert all(len(each) == 5 for each in served)  # one per organization per tick
    assert len(set().union(*served)) > 5  # not the same five every tick
