"""What a client may filter schedules by, and the runs list's `?schedule=`: the
FilterSets the selectors apply (``common.filters.StrictFilterSet``), as ``runs.filters``.
"""

from __future__ import annotations

from typing import Any, ClassVar
from uuid import UUID

import django_filters
from django.db.models import Q, QuerySet

from common.filters import StrictFilterSet
from runs.filters import RunFilter
from schedules.models import Schedule, ScheduleFire, ScheduleStatus


class ScheduleFilter(StrictFilterSet):
    status = django_filters.ChoiceFilter(
        choices=ScheduleStatus.choices,
        method="filter_status",
        help_text="active (due times ahead), paused, or ended (none left).",
    )
    name = django_filters.CharFilter(
        lookup_expr="icontains", max_length=200, help_text="Part of the name, case-insensitive."
    )

    blank_allowed = frozenset({"name"})

    class Meta:
        model = Schedule
        fields: ClassVar[list[str]] = []

    def filter_status(self, queryset: QuerySet[Any], name: str, value: str) -> QuerySet[Any]:
        if value == ScheduleStatus.PAUSED:
            return queryset.filter(paused_at__isnull=False)
        ended = value == ScheduleStatus.ENDED
        return queryset.filter(Q(paused_at__isnull=True) & Q(next_due_at__isnull=ended))


class ScheduledRunFilter(RunFilter):
    """The runs list's filters, and one more: the runs a schedule started (the link lives
    in the schedules app's table, ``ScheduleFire.run``; runs know nothing of schedules)."""

    schedule = django_filters.UUIDFilter(
        method="filter_schedule", help_text="Only the runs this schedule started."
    )

    class Meta(RunFilter.Meta):
        pass

    def filter_schedule(self, queryset: QuerySet[Any], name: str, value: UUID) -> QuerySet[Any]:
        started = ScheduleFire.objects.filter(schedule_id=value, run__isnull=False)
        return queryset.filter(pk__in=started.values("run_id"))
