"""Reads of runs and their hierarchy, always scoped to one organization.

Lists are filtered by the FilterSets of ``runs.filters``: ``query`` is the client's query
(parameter -> value), applied whole or refused with ``QueryInvalid`` when a parameter is
unknown or malformed. A list is one query for its rows whatever their number (the API's
page-number envelopes add a COUNT; events are paged by key and never counted): credits
are correlated subqueries evaluated for the page's rows only, and the names shown beside
a task or step come in through ``select_related``.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass
from decimal import Decimal
from typing import Any
from uuid import UUID

from django.db import connection
from django.db.models import (
    BigIntegerField,
    Case,
    CharField,
    DecimalField,
    F,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    Sum,
    UUIDField,
    Value,
    When,
)
from django.db.models.functions import Cast, Coalesce, Concat

from billing.models import Organization, Reservation
from common.filters import QueryData
from runs.filters import (
    AgentFilter,
    EventFilter,
    RunFilter,
    RunnerJobFilter,
    StepFilter,
    TaskFilter,
)
from runs.models import Agent, Run, RunEvent, RunnerJob, Step, Task
from runs.services import RunNotFound
from runs.states import STEP_TERMINAL, RunStatus, StepStatus

ZERO = Decimal(0)


def _attempt_sum(expression: Any, condition: Q | None = None) -> Coalesce:
    """A sum over the run's reservations (one per attempt, billing's rows)."""
    total = (
        Reservation.objects.filter(run_id=OuterRef("pk"))
        .order_by()
        .values("run_id")
        .annotate(total=Sum(expression, filter=condition))
        .values("total")[:1]
    )
    amount = DecimalField(max_digits=24, decimal_places=6)
    return Coalesce(Subquery(total, output_field=amount), ZERO, output_field=amount)


def with_credits(runs: QuerySet[Run]) -> QuerySet[Run]:
    """Annotate each run's credits over all its attempts (reserved, charged, refunded,
    and held: reserved but neither charged nor refunded yet)."""
    return runs.annotate(
        credits_reserved=_attempt_sum(F("reserved")),
        credits_charged=_attempt_sum(F("charged")),
        credits_refunded=_attempt_sum(F("refunded")),
        credits_held=_attempt_sum(
            F("reserved") - F("charged") - F("refunded"),
            Q(settled_at__isnull=True),
        ),
    )


def run_list(*, organization: Organization, query: QueryData | None = None) -> QuerySet[Run]:
    """The organization's runs as ``query`` filters and orders them (``RunFilter``; newest
    first by default), soft-deleted ones hidden; the plan itself is not loaded. Their
    credits are set on the page's rows (``attach_credits``), not computed per row here."""
    runs = Run.objects.filter(organization=organization, deleted_at__isnull=True)
    return RunFilter(query or {}, queryset=runs.defer("plan", "variables")).filtered()


_PAGE_CREDITS_SQL = """
SELECT run_id, sum(reserved), sum(charged), sum(refunded),
       COALESCE(sum(reserved - charged - refunded) FILTER (WHERE settled_at IS NULL), 0)
FROM billing_reservation WHERE run_id = ANY(%(runs)s) GROUP BY run_id
"""


def attach_credits(runs: list[Run]) -> list[Run]:
    """Set each run's credits as ``with_credits`` annotates them, for a page of runs
    already read: one grouped statement over the page's ids instead of four correlated
    subqueries per row in the page's own query (and their SQL to compile)."""
    sums: dict[Any, tuple[Decimal, Decimal, Decimal, Decimal]] = {}
    if runs:
        with connection.cursor() as cursor:
            cursor.execute(_PAGE_CREDITS_SQL, {"runs": [run.pk for run in runs]})
            sums = {run_id: tuple(rest) for run_id, *rest in cursor.fetchall()}
    for run in runs:
        reserved, charged, refunded, held = sums.get(run.pk, (ZERO, ZERO, ZERO, ZERO))
        run.credits_reserved, run.credits_charged = reserved, charged  # type: ignore[attr-defined]
        run.credits_refunded, run.credits_held = refunded, held  # type: ignore[attr-defined]
    return runs


def run_get(*, organization: Organization, run_id: UUID | str, credits: bool = True) -> Run:
    """One run of the organization (soft-deleted too), with its credits unless told not
    to; RunNotFound for any other organization's run."""
    runs = Run.objects.filter(organization=organization)
    try:
        return (with_credits(runs) if credits else runs).get(pk=run_id)
    except (Run.DoesNotExist, ValueError) as exc:
        raise RunNotFound(f"run {run_id} not found") from exc


@dataclass(frozen=True)
class RunSummary:
    """The current attempt's agents, tasks and steps counted by status, and its progress."""

    counts: dict[str, dict[str, int]]
    steps_total: int
    steps_finished: int
    completed: bool

    @property
    def percent(self) -> float:
        if self.completed:
            return 100.0
        if not self.steps_total:
            return 0.0
        return round(100 * self.steps_finished / self.steps_total, 1)


# The current attempt's agents, tasks and steps counted by status, and with
# %(credits)s the run's credits over all its attempts (``with_credits``'s sums): one
# statement, one round trip, no ORM to compile. A status poll reads this on every call.
_COUNTS_SQL = """
SELECT 'agents', status, false, count(*)::numeric, NULL::numeric, NULL::numeric, NULL::numeric
FROM runs_agent WHERE run_id = %(run)s AND attempt_number = %(attempt)s GROUP BY status
UNION ALL
SELECT 'tasks', status, false, count(*), NULL, NULL, NULL
FROM runs_task WHERE run_id = %(run)s AND attempt_number = %(attempt)s GROUP BY status
UNION ALL
SELECT 'steps', status, handler_for_id IS NOT NULL, count(*), NULL, NULL, NULL
FROM runs_step WHERE run_id = %(run)s AND attempt_number = %(attempt)s GROUP BY 2, 3
"""
_CREDITS_SQL = """
UNION ALL
SELECT 'credits', '', false, COALESCE(sum(reserved), 0), COALESCE(sum(charged), 0),
       COALESCE(sum(refunded), 0),
       COALESCE(sum(reserved - charged - refunded) FILTER (WHERE settled_at IS NULL), 0)
FROM billing_reservation WHERE run_id = %(run)s
"""


def run_summary(run: Run, *, credits: bool = False) -> RunSummary:
    """The current attempt's counts and progress: one statement whatever the size of the
    run. With ``credits``, the same statement also sets the run's credits, as
    ``with_credits`` annotates them (``credits_reserved``, ``_charged``, ``_refunded``,
    ``_held``)."""
    counts: dict[str, dict[str, int]] = {"agents": {}, "tasks": {}, "steps": {}}
    total = finished = 0
    with connection.cursor() as cursor:
        cursor.execute(
            _COUNTS_SQL + (_CREDITS_SQL if credits else ""),
            {"run": run.pk, "attempt": run.attempt_number},
        )
        for kind, status, handler, n, charged, refunded, held in cursor.fetchall():
            if kind == "credits":
                run.credits_reserved, run.credits_charged = n, charged  # type: ignore[attr-defined]
                run.credits_refunded, run.credits_held = refunded, held  # type: ignore[attr-defined]
                continue
            by_status = counts[kind]
            by_status[status] = by_status.get(status, 0) + int(n)
            if kind == "steps" and not handler:  # on_error handlers run only on failure
                total += int(n)
                finished += int(n) if status in STEP_TERMINAL else 0
    return RunSummary(
        counts=counts,
        steps_total=total,
        steps_finished=finished,
        completed=run.status == RunStatus.COMPLETED,
    )


# --------------------------------------------------------------------------- hierarchy
def agent_list(*, run: Run, query: QueryData | None = None) -> QuerySet[Agent]:
    """The run's agents of one attempt (``AgentFilter``: the current one by default)."""
    agents = AgentFilter(query or {}, queryset=Agent.objects.filter(run=run)).filtered()
    return agents.order_by("position", "id")


def task_list(*, run: Run, query: QueryData | None = None) -> QuerySet[Task]:
    """The run's tasks of one attempt (``TaskFilter``), each with its agent."""
    tasks = TaskFilter(query or {}, queryset=Task.objects.filter(run=run)).filtered()
    return tasks.select_related("agent").order_by("agent__position", "generation", "position", "id")


def step_list(*, run: Run, query: QueryData | None = None) -> QuerySet[Step]:
    """The run's steps of one attempt (``StepFilter``), each with its task and agent, and
    the work it started (``with_work``)."""
    steps = StepFilter(query or {}, queryset=Step.objects.filter(run=run)).filtered()
    return with_work(steps.select_related("task__agent")).order_by(
        "task__agent__position",
        "task__generation",
        "task__position",
        "generation",
        "position",
        "id",
    )


def with_work(steps: QuerySet[Step]) -> QuerySet[Step]:
    """Each step with ``job``, the id of its latest attempt's runner job (a `runner`
    step), and ``child_run``, the child run its latest attempt started (a `run` step);
    None for other tools and until the attempt creates them. The latest attempt is the
    current one: a step's attempts only grow. Each is one index probe per row
    (runnerjob_one_per_attempt, run_one_child_per_step_attempt), and only for its tool."""
    job = RunnerJob.objects.filter(step=OuterRef("pk")).order_by("-attempt").values("id")[:1]
    child = (
        Run.objects.filter(parent_step=OuterRef("pk"))
        .order_by("-parent_step_attempt")
        .values("id")[:1]
    )
    return steps.annotate(
        job=Case(When(tool="runner", then=Subquery(job)), output_field=UUIDField()),
        child_run=Case(When(tool="run", then=Subquery(child)), output_field=UUIDField()),
    )


def runner_job_list(
    *, organization: Organization, query: QueryData | None = None
) -> QuerySet[RunnerJob]:
    """The organization's runner jobs (``RunnerJobFilter``), newest first."""
    jobs = RunnerJob.objects.filter(organization=organization)
    return RunnerJobFilter(query or {}, queryset=jobs).filtered().order_by("-created_at", "-id")


def event_list(*, run: Run, query: QueryData | None = None) -> QuerySet[RunEvent]:
    """The run's history in order (``EventFilter``; ``after`` an event id, to follow it as
    it grows), each event with its ``path``. Ordered by id alone, which the (run, id)
    index serves to keyset pages."""
    events = EventFilter(query or {}, queryset=RunEvent.objects.filter(run=run)).filtered()
    return with_paths(events.order_by("id"))


def _named(model: type[Agent | Task | Step], *parts: Any) -> Subquery:
    """The dotted path of the ``model`` row an event names (its ``entity_id``)."""
    joined: list[Any] = []
    for part in parts:
        joined += [part, Value(".")]
    path = Concat(*joined[:-1], output_field=CharField()) if len(parts) > 1 else F(parts[0])
    rows = model.objects.filter(pk=Cast(OuterRef("entity_id"), BigIntegerField()))
    return Subquery(rows.annotate(path=path).values("path")[:1], output_field=CharField())


def with_paths(events: QuerySet[RunEvent]) -> QuerySet[RunEvent]:
    """Events annotated with ``path``: where in the plan the entity they name is,
    ``agent.task.step`` (``agent.task``, ``agent``; "" for the run itself), as people
    read it, rather than a database id. One subquery per row of a page, by primary key
    (CASE evaluates only the branch of the event's entity: a run's id is not cast)."""
    return events.annotate(
        path=Case(
            When(entity="step", then=_named(Step, "task__agent__name", "task__name", "name")),
            When(entity="task", then=_named(Task, "agent__name", "name")),
            When(entity="agent", then=_named(Agent, "name")),
            default=Value(""),
            output_field=CharField(),
        )
    )


def event_label(event: RunEvent) -> str:
    """What an event is about, for people: its ``path`` (``with_paths``) and, for a step,
    the attempt its payload names; "run" for the run itself."""
    path = getattr(event, "path", "") or ""
    if not path:
        return event.entity if event.entity == "run" else f"{event.entity} {event.entity_id}"
    attempt = event.payload.get("attempt") if isinstance(event.payload, dict) else None
    return f"{path} (attempt {attempt})" if event.entity == "step" and attempt else path


@dataclass(frozen=True)
class RunDetail:
    run: Run
    summary: RunSummary
    children: list[Any]
    outputs: RunOutputs | None  # None when excluded
    excluded: frozenset[str] = frozenset()


# What a client may leave out of a run's detail (`GET /runs/{id}?exclude=`): the parts
# that grow with the run, so that a status poll stays small whatever its size.
DETAIL_EXCLUDABLE = ("outputs", "plan")


def run_detail(
    *, organization: Organization, run_id: UUID | str, exclude: Collection[str] = ()
) -> RunDetail:
    """A run with its credits, counts, progress, child runs and outputs: four queries
    (three when its outputs are excluded)."""
    excluded = frozenset(exclude)
    unknown = excluded.difference(DETAIL_EXCLUDABLE)
    if unknown:
        raise ValueError(f"cannot exclude {sorted(unknown)}")
    run = run_get(organization=organization, run_id=run_id, credits=False)
    summary = run_summary(run, credits=True)  # the credits in the same round trip
    children = list(
        Run.objects.filter(parent_run=run)
        .order_by("created_at")
        .values("id", "status", "parent_mode", "parent_step_id", "created_at")
    )
    outputs = None if "outputs" in excluded else run_outputs(run)
    return RunDetail(run, summary, children, outputs, excluded)


def created_run_detail(run: Run) -> RunDetail:
    """The detail of a run ``run_create`` has just written and returned, without reading
    it again: a CREATED run has no attempt, agents, tasks, steps, children, credits or
    outputs yet, so its detail is its row (the row the INSERT returned, database
    defaults included) and nothing else. Equal to ``run_detail``'s (a test holds them to
    it)."""
    if run.status != RunStatus.CREATED:
        raise ValueError(f"run {run.pk} is {run.status}, not created: read its detail")
    run.credits_reserved = run.credits_charged = ZERO  # type: ignore[attr-defined]
    run.credits_refunded = run.credits_held = ZERO  # type: ignore[attr-defined]
    summary = RunSummary(
        counts={"agents": {}, "tasks": {}, "steps": {}},
        steps_total=0,
        steps_finished=0,
        completed=False,
    )
    return RunDetail(run, summary, [], RunOutputs({}, truncated=False))


# The most of a run's outputs that its detail, or a sync parent step, carries: the step
# output limit (orchestrator.executor.MAX_OUTPUT_BYTES) of JSON.
OUTPUTS_MAX_BYTES = 1_000_000


@dataclass(frozen=True)
class RunOutputs:
    values: dict[str, Any]
    truncated: bool  # outputs were left out to stay within OUTPUTS_MAX_BYTES


def run_outputs(run: Run, max_bytes: int = OUTPUTS_MAX_BYTES) -> RunOutputs:
    """``{"agent.task.step": output}`` of the completed steps of the run's current
    attempt (a task run again by its failure mode: its last generation's), in plan
    order, as many as fit in ``max_bytes`` of JSON."""
    rows = (
        Step.objects.filter(run=run, attempt_number=run.attempt_number, status=StepStatus.COMPLETED)
        .order_by("task__agent__position", "task__position", "generation", "position")
        .values_list("task__agent__name", "task__name", "name", "output")
    )
    values: dict[str, Any] = {}
    used = 0
    for agent, task, step, output in rows.iterator(chunk_size=500):
        key = f"{agent}.{task}.{step}"
        used += len(key) + len(json.dumps(output, separators=(",", ":"))) + 4
        if used > max_bytes:
            return RunOutputs(values, truncated=True)
        values[key] = output
    return RunOutputs(values, truncated=False)
