"""What a client may filter runs and their hierarchy by: the FilterSets the selectors apply.

Each parameter keeps the name, values and meaning the API documents (docs/api.md); the
API checks a query against the same FilterSet before it looks anything up, then passes it
to the selector, which applies it (``StrictFilterSet.filtered``).
"""

from __future__ import annotations

from typing import Any, ClassVar

import django_filters
from django.db.models import F, QuerySet

from common.filters import (
    MAX_BIGINT,
    IntegerFilter,
    OrderingChoiceFilter,
    StrictFilterSet,
    UtcDateTimeFilter,
)
from runs.models import (
    Agent,
    EventKind,
    Run,
    RunEvent,
    RunnerJob,
    RunnerJobStatus,
    Step,
    Task,
)
from runs.states import NodeStatus, RunStatus, StepStatus

MAX_ATTEMPT = 32767  # attempt_number is a PositiveSmallIntegerField
# Client-facing orderings; each gets the primary key as a tie-breaker for stable pages.
RUN_ORDERINGS = (
    "created_at",
    "-created_at",
    "priority",
    "-priority",
    "name",
    "-name",
    "status",
    "-status",
    "updated_at",
    "-updated_at",
)


class RunFilter(StrictFilterSet):
    status = django_filters.MultipleChoiceFilter(
        choices=RunStatus.choices,
        # A run has one status: no join to deduplicate (the default DISTINCT would cost).
        distinct=False,
        help_text="Only runs in these states (repeat the parameter for several).",
    )
    name = django_filters.CharFilter(
        lookup_expr="icontains", max_length=200, help_text="Part of the name, case-insensitive."
    )
    created_after = UtcDateTimeFilter(
        field_name="created_at", lookup_expr="gte", help_text="Inclusive."
    )
    created_before = UtcDateTimeFilter(
        field_name="created_at", lookup_expr="lt", help_text="Exclusive."
    )
    priority = IntegerFilter(min_value=0, max_value=9)
    parent_run = django_filters.UUIDFilter(
        field_name="parent_run_id", help_text="Only the child runs of this run."
    )
    ordering = OrderingChoiceFilter(orderings=RUN_ORDERINGS, default="-created_at")

    blank_allowed = frozenset({"name"})  # `?name=` matches every name, as it always has

    class Meta:
        model = Run
        fields: ClassVar[list[str]] = []  # only the filters declared above


class AttemptFilter(StrictFilterSet):
    """One attempt's rows of a run's hierarchy; the run's current attempt when omitted."""

    attempt = IntegerFilter(
        field_name="attempt_number",
        min_value=1,
        max_value=MAX_ATTEMPT,
        help_text="Attempt number; the current attempt when omitted.",
    )

    def filter_queryset(self, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.form.cleaned_data.get("attempt") is None:
            # The run's attempt number, read in the same query as the rows it selects.
            queryset = queryset.filter(attempt_number=F("run__attempt_number"))
        return super().filter_queryset(queryset)


class AgentFilter(AttemptFilter):
    status = django_filters.ChoiceFilter(choices=NodeStatus.choices)

    class Meta:
        model = Agent
        fields: ClassVar[list[str]] = []


class TaskFilter(AttemptFilter):
    agent = IntegerFilter(field_name="agent_id", min_value=1, max_value=MAX_BIGINT)
    status = django_filters.ChoiceFilter(choices=NodeStatus.choices)

    class Meta:
        model = Task
        fields: ClassVar[list[str]] = []


class StepFilter(AttemptFilter):
    task = IntegerFilter(field_name="task_id", min_value=1, max_value=MAX_BIGINT)
    status = django_filters.ChoiceFilter(choices=StepStatus.choices)
    tool = django_filters.CharFilter(
        max_length=64, help_text="Only the steps of this tool (`runner`, `run`...)."
    )

    class Meta:
        model = Step
        fields: ClassVar[list[str]] = []


class EventFilter(StrictFilterSet):
    attempt = IntegerFilter(
        field_name="attempt_number",
        min_value=0,
        max_value=MAX_ATTEMPT,
        help_text="All when omitted.",
    )
    kind = django_filters.ChoiceFilter(choices=EventKind.choices)
    after = IntegerFilter(
        field_name="id",
        lookup_expr="gt",
        min_value=0,
        max_value=MAX_BIGINT,
        help_text="Only events after this event id (to follow a run as it goes).",
    )

    class Meta:
        model = RunEvent
        fields: ClassVar[list[str]] = []


class RunnerJobFilter(StrictFilterSet):
    """An organization's runner jobs (``GET /runner-jobs``): a client finds the job of a
    run's `runner` step to read or stop it."""

    run = django_filters.UUIDFilter(field_name="run_id", help_text="Only this run's jobs.")
    step = IntegerFilter(
        field_name="step_id", min_value=1, max_value=MAX_BIGINT, help_text="Only this step's jobs."
    )
    status = django_filters.MultipleChoiceFilter(
        choices=RunnerJobStatus.choices,
        distinct=False,
        help_text="Only jobs in these states (repeat the parameter for several).",
    )
    runner_id = django_filters.CharFilter(
        field_name="runner_id", max_length=40, help_text="Only the jobs this runner claimed."
    )

    class Meta:
        model = RunnerJob
        fields: ClassVar[list[str]] = []
