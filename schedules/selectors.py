"""Reading schedules, their fires and the runs they started: the API's and the admin's
queries, each a fixed number of statements whatever the number of rows."""

from __future__ import annotations

from datetime import datetime
from uuid import UUID

from django.core.exceptions import ValidationError
from django.db.models import OuterRef, QuerySet, Subquery

from billing.models import Organization
from common.filters import QueryData
from runs import selectors as run_selectors
from runs.models import Run
from schedules.filters import ScheduledRunFilter, ScheduleFilter
from schedules.models import ACTIVE, Schedule, ScheduleFire
from schedules.services import ScheduleNotFound


def schedules_next_due() -> datetime | None:
    """The earliest due time of an active schedule: when beat sends the tick next
    (orchestrator/periodic.py). One row of the tick's own index."""
    rows = Schedule.objects.filter(ACTIVE).order_by("next_due_at")
    return rows.values_list("next_due_at", flat=True).first()


def with_last_run(schedules: QuerySet[Schedule]) -> QuerySet[Schedule]:
    """Each schedule with ``last_run_id`` and ``last_run_status``: the run of its latest
    fire that started one (a due time or a trigger), or None."""
    last = ScheduleFire.objects.filter(schedule=OuterRef("pk"), run__isnull=False).order_by("-id")
    return schedules.annotate(
        last_run_id=Subquery(last.values("run_id")[:1]),
        last_run_status=Subquery(last.values("run__status")[:1]),
    )


def schedule_list(
    *, organization: Organization, query: QueryData | None = None
) -> QuerySet[Schedule]:
    """The organization's schedules, newest first, as ``query`` filters them
    (``ScheduleFilter``)."""
    rows = Schedule.objects.filter(organization=organization).order_by("-created_at", "-id")
    return ScheduleFilter(query or {}, queryset=with_last_run(rows)).filtered()


def schedule_get(*, organization: Organization | None, schedule_id: UUID | str) -> Schedule:
    """One schedule with its last run; another organization's is not found."""
    rows = Schedule.objects.all()
    if organization is not None:
        rows = rows.filter(organization=organization)
    try:
        schedule = with_last_run(rows).filter(pk=schedule_id).first()
    except (ValueError, ValidationError):
        schedule = None
    if schedule is None:
        raise ScheduleNotFound(f"schedule {schedule_id} not found")
    return schedule


def fire_list(*, schedule: Schedule) -> QuerySet[ScheduleFire]:
    """What became of each due time and trigger of the schedule, newest first."""
    return (
        ScheduleFire.objects.filter(schedule=schedule)
        .select_related("run")
        .only(*FIRE_FIELDS)
        .order_by("-id")
    )


FIRE_FIELDS = (
    "id",
    "schedule_id",
    "kind",
    "due_at",
    "status",
    "reason",
    "message",
    "created_at",
    "run__id",
    "run__status",
)


def run_list(*, organization: Organization, query: QueryData | None = None) -> QuerySet[Run]:
    """``runs.selectors.run_list`` with one filter more, ``schedule`` (the runs a schedule
    started): the runs list of the API."""
    runs = run_selectors.run_list(organization=organization)
    return ScheduledRunFilter(query or {}, queryset=runs).filtered()
