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
    Case,
    CharField,
    F,
    Func,
    OuterRef,
    QuerySet,
    Subquery,
    UUIDField,
    Value,
    When,
)
from django.db.models.functions import Concat

from billing.models import Organization
from common.filters import MAX_BIGINT, QueryData
from common.queries import dicts, fetch, instances
from runs.filters import (
    AgentFilter,
    RunFilter,
    RunnerJobFilter,
    TaskFilter,
)
from runs.models import Agent, HistoryEvent, Run, RunnerJob, Step, Task
from runs.queries import QUERIES
from runs.services import RunNotFound
from runs.states import STEP_TERMINAL, RunStatus

ZERO = Decimal(0)
# A one-row table function of the database as an ORM expression: a scalar subquery of it,
# which the planner inlines (a plain call of a SQL function with subqueries it does not).
INLINED = "(SELECT * FROM %s(%%(expressions)s))"


def run_list(*, organization: Organization, query: QueryData | None = None) -> QuerySet[Run]:
    """The organization's runs as ``query`` filters and orders them (``RunFilter``; newest
    first by default), soft-deleted ones hidden; the plan itself is not loaded. Their
    credits are set on the page's rows (``attach_credits``), not computed per row here;
    ``runs_by_status`` reads the most asked query, by status alone, in one statement."""
    runs = Run.objects.filter(organization=organization, deleted_at__isnull=True)
    return RunFilter(query or {}, queryset=runs.defer("plan", "variables")).filtered()


# A run as a list shows it: every column but its plan and variables.
LISTED = tuple(
    field.attname for field in Run._meta.concrete_fields if field.name not in ("plan", "variables")
)


def run_rows(runs: QuerySet[Run]) -> QuerySet[Any]:
    """``runs`` as dict rows of what a list shows (``LISTED``), no model instances."""
    rows: QuerySet[Any] = runs.values(*LISTED)
    return rows


def attach_credits(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Set each run's credits over all its attempts (``credits_reserved``,
    ``credits_charged``, ``credits_refunded``, ``credits_held``: billing.run_credits), for
    runs already read (dict rows with their ``id``): one statement for all of them."""
    sums: dict[Any, tuple[Decimal, Decimal, Decimal, Decimal]] = {}
    if runs:
        _, rows = fetch(QUERIES["page_credits"], {"runs": [run["id"] for run in runs]})
        sums = {run_id: tuple(rest) for run_id, *rest in rows}
    for run in runs:
        reserved, charged, refunded, held = sums.get(run["id"], (ZERO, ZERO, ZERO, ZERO))
        run.update(
            credits_reserved=reserved,
            credits_charged=charged,
            credits_refunded=refunded,
            credits_held=held,
        )
    return runs


def runs_by_status(
    *, organization: Organization, statuses: list[str], limit: int, offset: int
) -> tuple[int | None, list[dict[str, Any]]]:
    """A page of the organization's runs in ``statuses``, newest first, as ``run_list``
    orders and filters them for ``{"status": statuses}``, their credits set: one
    statement (runs/queries/runs_by_status.sql). Returns how many match in all (None when
    the page is empty: past the end, or nothing matches) and the page, a dict a run."""
    names, rows = fetch(
        QUERIES["runs_by_status"],
        {"organization": organization.pk, "statuses": statuses, "limit": limit, "offset": offset},
    )
    runs = dicts(Run, names, rows)
    return (runs[0]["total"] if runs else None), runs


def run_get(*, organization: Organization, run_id: UUID | str) -> Run:
    """One run of the organization (soft-deleted too), RunNotFound for any other
    organization's run: its id, status and current attempt, what the lists of its parts
    need (the other fields are deferred, as with ``only()``). One statement, no ORM."""
    params = {"organization": organization.pk, "run": _run_id(run_id)}
    names, rows = fetch(QUERIES["run_get"], params)
    if not rows:
        raise RunNotFound(f"run {run_id} not found")
    return instances(Run, names, rows)[0]


def _run_id(run_id: UUID | str) -> UUID:
    try:
        return run_id if isinstance(run_id, UUID) else UUID(str(run_id))
    except ValueError as exc:
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


def run_summary(run: Run) -> RunSummary:
    """The current attempt's counts and progress: one statement whatever the size of the
    run (runs.run_counts)."""
    with connection.cursor() as cursor:
        cursor.execute(QUERIES["run_summary"], {"run": run.pk, "attempt": run.attempt_number})
        return _summary(run, cursor.fetchall())


def _summary(run: Run, counted: list[Any]) -> RunSummary:
    """A summary from runs.run_counts's rows: (kind, status, handler, count)."""
    counts: dict[str, dict[str, int]] = {"agents": {}, "tasks": {}, "steps": {}}
    total = finished = 0
    for kind, status, handler, n in counted:
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


def steps_page(
    *, run: Run, query: QueryData, limit: int, offset: int
) -> tuple[int | None, list[dict[str, Any]]]:
    """A page of the run's steps of one attempt in plan order, as ``query`` (the cleaned
    values of ``StepFilter``: attempt, the current one when None; task, status, tool)
    selects them, each with ``task_name``, ``agent_name`` and the work it started
    (``job``, ``child_run``: runs.step_work): one statement
    (runs/queries/steps_page.sql). Returns how many match in all (None when the page is
    empty) and the page, a dict a step."""
    params = {name: query.get(name) or None for name in ("attempt", "task", "status", "tool")}
    names, rows = fetch(
        QUERIES["steps_page"], {**params, "run": run.pk, "limit": limit, "offset": offset}
    )
    steps = dicts(Step, names, rows)
    return (steps[0]["total"] if steps else None), steps


def with_work(steps: QuerySet[Step]) -> QuerySet[Step]:
    """Each step with ``job``, the id of its latest attempt's runner job (a `runner`
    step's, runs.step_work; a worker tool's, by the job's (step, attempt) index), and
    ``child_run``, the child run its latest attempt started (a `run` step); None for
    other tools and until the attempt creates them."""
    work = Func(F("pk"), F("tool"), template=INLINED % "runs.step_work", output_field=UUIDField())
    tool_job = RunnerJob.objects.filter(step=OuterRef("pk")).order_by("-attempt").values("id")
    return steps.annotate(
        job=Case(
            When(tool="runner", then=work),
            # A published tool's name has a dot; a fleet tool's step has no job.
            When(tool__contains=".", then=Subquery(tool_job[:1])),
            output_field=UUIDField(),
        ),
        child_run=Case(When(tool="run", then=work), output_field=UUIDField()),
    )


def with_step_path(jobs: QuerySet[RunnerJob]) -> QuerySet[RunnerJob]:
    """Each job with ``step_path``, its step's ``agent.task.step`` (what a worker tool's
    ``Context.step_path`` says), read in the jobs' own statement: joins by primary key."""
    return jobs.annotate(
        step_path=Concat(
            "step__task__agent__name",
            Value("."),
            "step__task__name",
            Value("."),
            "step__name",
            output_field=CharField(),
        )
    )


def runner_job_list(
    *, organization: Organization, query: QueryData | None = None
) -> QuerySet[RunnerJob]:
    """The organization's runner jobs (``RunnerJobFilter``), newest first, each with its
    ``step_path``."""
    jobs = with_step_path(RunnerJob.objects.filter(organization=organization))
    return RunnerJobFilter(query or {}, queryset=jobs).filtered().order_by("-created_at", "-id")


def runner_job(*, organization: Organization, job_id: Any) -> RunnerJob | None:
    """One of the organization's runner jobs, with its ``step_path``; None if none."""
    return with_step_path(RunnerJob.objects.filter(organization=organization, pk=job_id)).first()


def run_history(run: Run | UUID | str) -> QuerySet[HistoryEvent]:
    """The run's history in id order, as every reader lists it: its event rows and the
    events kept on its steps' rows (a claim, a plain completion), each as its row would
    be (runs.run_history; docs/engine.md, "A step's history"). Read a run's events
    here, never from ``RunEvent``, which holds the rows alone."""
    run_id = run.pk if isinstance(run, Run) else run
    return HistoryEvent.objects.filter(run_id=run_id).order_by("id")


def events_page(
    *, run: Run, query: QueryData, after: int = 0, before: int | None = None, limit: int
) -> list[dict[str, Any]]:
    """The run's events (its history, ``run_history``) in ascending id, as ``query`` (the
    cleaned values of ``EventFilter``: attempt, kind, after) selects them, each with its
    ``path`` (runs.event_path): the ``limit`` first after ``after`` or, with ``before``,
    the ``limit`` last before it, a dict an event. One statement
    (runs/queries/events_page.sql) on the history's (run, id) indexes, to keyset pages and
    to follow a run as it grows."""
    params = {
        "run": run.pk,
        "attempt": query.get("attempt"),
        "kind": query.get("kind") or None,
        "above": max(after, query.get("after") or 0),
        "below": MAX_BIGINT if before is None else before,
        "descending": before is not None,
        "limit": limit,
    }
    names, rows = fetch(QUERIES["events_page"], params)
    return dicts(HistoryEvent, names, rows)


def with_paths(events: QuerySet[HistoryEvent]) -> QuerySet[HistoryEvent]:
    """Events annotated with ``path``: where in the plan the entity they name is,
    ``agent.task.step`` (``agent.task``, ``agent``; "" for the run itself), as people
    read it, rather than a database id (runs.event_path)."""
    path = Func(
        F("entity"),
        F("entity_id"),
        template=INLINED % "runs.event_path",
        output_field=CharField(),
    )
    return events.annotate(path=path)


def event_label(event: HistoryEvent) -> str:
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
    """A run with its credits, counts, progress, child runs and outputs: one statement
    (runs/queries/run_read.sql), with its outputs when it has no more than
    ``OUTPUTS_INLINE`` (one statement more for them otherwise), and one for its children
    when it has any."""
    excluded = frozenset(exclude)
    unknown = excluded.difference(DETAIL_EXCLUDABLE)
    if unknown:
        raise ValueError(f"cannot exclude {sorted(unknown)}")
    params = {"organization": organization.pk, "run": _run_id(run_id)}
    wanted = {"plan": "plan" not in excluded, "outputs": "outputs" not in excluded}
    names, rows = fetch(QUERIES["run_read"], {**params, **wanted, "inline": OUTPUTS_INLINE + 1})
    if not rows:
        raise RunNotFound(f"run {run_id} not found")
    run = instances(Run, names, rows)[0]
    summary = _summary(run, run.counts or [])  # type: ignore[attr-defined]
    children: list[dict[str, Any]] = []
    if run.has_children:  # type: ignore[attr-defined]
        names, rows = fetch(QUERIES["run_children"], params)
        children = [dict(zip(names, row, strict=True)) for row in rows]
    outputs = None
    if "outputs" not in excluded:
        first = run.outputs or []  # type: ignore[attr-defined]
        outputs = _outputs(first) if len(first) <= OUTPUTS_INLINE else run_outputs(run)
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
# The outputs a run's detail reads in its own statement (a small run's all): past this
# many, one statement more reads them all, as many as fit in OUTPUTS_MAX_BYTES.
OUTPUTS_INLINE = 100


@dataclass(frozen=True)
class RunOutputs:
    values: dict[str, Any]
    truncated: bool  # outputs were left out to stay within OUTPUTS_MAX_BYTES


def run_outputs(run: Run, max_bytes: int = OUTPUTS_MAX_BYTES) -> RunOutputs:
    """``{"agent.task.step": output}`` of the completed steps of the run's current
    attempt (a task run again by its failure mode: its last generation's), in plan
    order, as many as fit in ``max_bytes`` of JSON (runs.run_outputs)."""
    _, rows = fetch(QUERIES["all_outputs"], {"run": run.pk, "attempt": run.attempt_number})
    # jsonb arrives as text
    decoded = [(*names, None if output is None else json.loads(output)) for *names, output in rows]
    return _outputs(decoded, max_bytes)


def _outputs(rows: list[Any], max_bytes: int = OUTPUTS_MAX_BYTES) -> RunOutputs:
    """``run_outputs`` of its rows: (agent, task, step, the output decoded)."""
    values: dict[str, Any] = {}
    used = 0
    for agent, task, step, value in rows:
        key = f"{agent}.{task}.{step}"
        used += len(key) + len(json.dumps(value, separators=(",", ":"))) + 4
        if used > max_bytes:
            return RunOutputs(values, truncated=True)
        values[key] = value
    return RunOutputs(values, truncated=False)
