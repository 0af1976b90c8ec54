"""Invariants of the run hierarchy and its state machines: counters equal to the rows
they count, links and states that agree between levels, timestamps that match states,
leases, escalations, and each attempt's charges against its reservation."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db.models import (
    Count,
    DecimalField,
    Exists,
    F,
    IntegerField,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    Sum,
)
from django.db.models.functions import Coalesce
from django.utils import timezone

from billing.models import EntryType, LedgerEntry, Reservation
from common.invariants import LIMIT, invariant, orphans
from runs.models import (
    Agent,
    EscalationStatus,
    EscalationTicket,
    Replan,
    ReplanStatus,
    Run,
    RunAttempt,
    Step,
    Task,
)
from runs.states import NODE_OPEN, NODE_TERMINAL, RUN_TERMINAL, STEP_TERMINAL, NodeStatus, RunStatus


def _count(model: type[Agent] | type[Task] | type[Step], **filters: object) -> Coalesce:
    counted = (
        model.objects.filter(**filters)
        .order_by()
        .values(*filters.keys())
        .annotate(n=Count("*"))
        .values("n")
    )
    return Coalesce(Subquery(counted[:1], output_field=IntegerField()), 0)


def _current_agents(**filters: object) -> QuerySet[Agent]:
    return Agent.objects.filter(
        run=OuterRef("pk"), attempt_number=OuterRef("attempt_number"), **filters
    )


def _ids(query: QuerySet[Run], message: str) -> list[str]:
    return [message.format(pk=pk) for pk in query.values_list("pk", flat=True)[:LIMIT]]


@invariant("hierarchy.counts", "counters equal the rows they count")
def hierarchy_counts() -> list[str]:
    problems: list[str] = []
    runs = Run.objects.annotate(
        actual=_count(Agent, run=OuterRef("pk"), attempt_number=OuterRef("attempt_number"))
    ).exclude(agent_count=F("actual"))
    problems += [
        f"run {r.pk}: agent_count {r.agent_count} but {r.actual} agents in attempt "
        f"{r.attempt_number}"
        for r in runs[:LIMIT]
    ]
    agents = Agent.objects.annotate(actual=_count(Task, agent=OuterRef("pk"))).exclude(
        task_count=F("actual")
    )
    problems += [
        f"agent {a.pk}: task_count {a.task_count} but {a.actual} tasks" for a in agents[:LIMIT]
    ]
    tasks = Task.objects.annotate(actual=_count(Step, task=OuterRef("pk"))).exclude(
        step_count=F("actual")
    )
    problems += [
        f"task {t.pk}: step_count {t.step_count} but {t.actual} steps" for t in tasks[:LIMIT]
    ]
    return problems


@invariant(
    "runs.orphans",
    "every link of a run's rows that the database does not check (a run's organization; an "
    "attempt's, agent's, task's, step's, event's and wait's parents) names a row that exists",
)
def run_orphans() -> list[str]:
    """The foreign keys PostgreSQL checked at every commit until the rows each step writes
    stopped paying for it (runs.models): each link is written from its parent's row and
    no parent is deleted, so none should be missing (docs/engine.md, "Links the database
    does not check")."""
    return orphans("runs")


@invariant(
    "hierarchy.links",
    "denormalised run and attempt links agree with the parents, the ledger's and "
    "reservations' with the attempt, step and run they name",
)
def hierarchy_links() -> list[str]:
    problems: list[str] = []
    for agent in Agent.objects.exclude(run_id=F("attempt__run_id"))[:LIMIT]:
        problems.append(f"agent {agent.pk}: run differs from its attempt's run")
    for agent in Agent.objects.exclude(attempt_number=F("attempt__attempt_number"))[:LIMIT]:
        problems.append(f"agent {agent.pk}: attempt_number differs from its attempt")
    for task in Task.objects.exclude(run_id=F("agent__run_id"))[:LIMIT]:
        problems.append(f"task {task.pk}: run differs from its agent's run")
    for task in Task.objects.exclude(attempt_number=F("agent__attempt_number"))[:LIMIT]:
        problems.append(f"task {task.pk}: attempt_number differs from its agent")
    for step in Step.objects.exclude(run_id=F("task__run_id"))[:LIMIT]:
        problems.append(f"step {step.pk}: run differs from its task's run")
    for step in Step.objects.exclude(attempt_number=F("task__attempt_number"))[:LIMIT]:
        problems.append(f"step {step.pk}: attempt_number differs from its task")
    # The ledger's links, written from the rows they name (billing/sql/credits_*.sql).
    # A grant names no run, a reserve or refund no step: only the links an entry has.
    entries = LedgerEntry.objects.order_by("pk")
    for link, differs, what in (
        ("attempt", ~Q(run_id=F("attempt__run_id")), "its run is not its attempt's"),
        ("step", ~Q(run_id=F("step__run_id")), "its run is not its step's"),
        ("run", ~Q(organization_id=F("run__organization_id")), "its organization is not its run's"),
    ):
        unlike = entries.filter(differs, **{f"{link}__isnull": False})
        problems += [
            f"ledger entry {pk}: {what}" for pk in unlike.values_list("pk", flat=True)[:LIMIT]
        ]
    reservations = Reservation.objects.order_by("pk").exclude(
        run_id=F("attempt__run_id"),
        attempt_number=F("attempt__attempt_number"),
        organization_id=F("attempt__run__organization_id"),
    )
    problems += [
        f"reservation {pk}: run, attempt number or organization differs from its attempt's"
        for pk in reservations.values_list("pk", flat=True)[:LIMIT]
    ]
    return problems


@invariant("runs.attempts", "a run has exactly the attempts 1..attempt_number")
def run_attempts() -> list[str]:
    runs = Run.objects.annotate(
        n=_count(RunAttempt, run=OuterRef("pk")),  # type: ignore[arg-type]
        has_current=Exists(
            RunAttempt.objects.filter(run=OuterRef("pk"), attempt_number=OuterRef("attempt_number"))
        ),
    ).filter(~Q(n=F("attempt_number")) | Q(attempt_number__gt=0, has_current=False))
    return [
        f"run {r.pk}: attempt_number {r.attempt_number} but {r.n} attempts" for r in runs[:LIMIT]
    ]


@invariant(
    "runs.attempts_settled",
    "every attempt reserved its credits, and an attempt that ended settled them",
)
def attempts_settled() -> list[str]:
    unreserved = RunAttempt.objects.filter(reservation__isnull=True)
    problems = [
        f"attempt {a.attempt_number} of run {a.run_id}: no reservation" for a in unreserved[:LIMIT]
    ]
    finished_unsettled = RunAttempt.objects.exclude(outcome="").filter(
        reservation__settled_at__isnull=True, reservation__isnull=False
    )
    problems += [
        f"attempt {a.attempt_number} of run {a.run_id}: finished but not settled"
        for a in finished_unsettled[:LIMIT]
    ]
    return problems


@invariant("runs.state_consistency", "a run's state agrees with its agents")
def run_state_consistency() -> list[str]:
    open_agent = Exists(_current_agents(status__in=NODE_OPEN))
    active_agent = Exists(_current_agents(status__in=[NodeStatus.PENDING, NodeStatus.RUNNING]))
    any_agent = Exists(_current_agents())
    # An agent failed: FAILED, or SKIPPED with its own error kept (a failure under a
    # `continue` run, or replaced by a re-plan), not skipped for a dependency.
    failed_agent = Exists(
        _current_agents().filter(
            Q(status=NodeStatus.FAILED)
            | (
                Q(status=NodeStatus.SKIPPED, last_error__isnull=False)
                & ~Q(last_error__code="dependency_failed")
            )
        )
    )
    unfinished_for = {
        RunStatus.COMPLETED: [s for s in NodeStatus.values if s not in ("completed", "skipped")],
        RunStatus.CANCELLED: NODE_OPEN,
    }
    problems: list[str] = []
    problems += _ids(
        Run.objects.filter(status=RunStatus.CREATED).filter(Q(attempt_number__gt=0) | any_agent),
        "run {pk}: created but has an attempt or agents",
    )
    problems += _ids(
        Run.objects.filter(status__in=[RunStatus.PENDING, RunStatus.RETRYING]).filter(any_agent),
        "run {pk}: agents exist before the attempt was picked up",
    )
    problems += _ids(
        # A run waiting for its planner holds itself open with no agent of its own.
        Run.objects.filter(status=RunStatus.RUNNING, replan_pending_since__isnull=True).exclude(
            active_agent
        ),
        "run {pk}: running but no agent is pending or running",
    )
    problems += _ids(
        Run.objects.filter(status=RunStatus.PAUSED).filter(active_agent),
        "run {pk}: paused but an agent is pending or running",
    )
    for status, bad in unfinished_for.items():
        problems += _ids(
            Run.objects.filter(status=status).filter(Exists(_current_agents(status__in=bad))),
            f"run {{pk}}: {status} but an agent is in one of {', '.join(bad)}",
        )
    problems += _ids(
        Run.objects.filter(status=RunStatus.COMPLETED).exclude(any_agent),
        "run {pk}: completed without agents",
    )
    problems += _ids(
        Run.objects.filter(status=RunStatus.FAILED, agent_count__gt=0).exclude(failed_agent),
        "run {pk}: failed but no agent failed",
    )
    problems += _ids(
        Run.objects.filter(status=RunStatus.FAILED, last_error__isnull=True),
        "run {pk}: failed without last_error",
    )
    problems += _ids(
        Run.objects.filter(status__in=RUN_TERMINAL).filter(open_agent),
        "run {pk}: finished but an agent is still open",
    )
    open_steps = Step.objects.filter(
        run=OuterRef("pk"), attempt_number=OuterRef("attempt_number")
    ).exclude(status__in=STEP_TERMINAL)
    problems += _ids(
        Run.objects.filter(status__in=RUN_TERMINAL).filter(Exists(open_steps)),
        "run {pk}: finished but a step is still open",
    )
    return problems


@invariant("runs.timestamps", "timestamps match states")
def run_timestamps() -> list[str]:
    problems: list[str] = []
    problems += _ids(
        Run.objects.filter(status__in=RUN_TERMINAL).filter(
            Q(completed_at__isnull=True) | Q(duration_ms__isnull=True)
        ),
        "run {pk}: finished without completed_at or duration_ms",
    )
    problems += _ids(
        Run.objects.filter(status=RunStatus.CANCELLED, cancelled_at__isnull=True),
        "run {pk}: cancelled without cancelled_at",
    )
    problems += _ids(
        Run.objects.exclude(status=RunStatus.CREATED)
        .filter(attempt_number__gt=0)
        .filter(started_at__isnull=True),
        "run {pk}: started without started_at",
    )
    for model, terminal in ((Agent, NODE_TERMINAL), (Task, NODE_TERMINAL), (Step, STEP_TERMINAL)):
        rows = model.objects.filter(status__in=terminal, completed_at__isnull=True)
        problems += [
            f"{model.__name__.lower()} {pk}: finished without completed_at"
            for pk in rows.values_list("pk", flat=True)[:LIMIT]
        ]
    return problems


@invariant("steps.leases", "running steps hold a live lease (heartbeat freshness)")
def step_leases() -> list[str]:
    """A running step whose lease expired a full lease period ago was missed by the sweep."""
    cutoff = timezone.now() - timedelta(seconds=2 * float(settings.ENGINE_LEASE_SECONDS))
    stale = Step.objects.filter(status="running", lease_expires_at__lt=cutoff)

    return [
        f"step {pk} (run {run_id}): running without a live lease"
        for pk, run_id in stale.values_list("pk", "run_id")[:LIMIT]
    ]


@invariant(
    "runs.people.escalations",
    "an escalated run has one open ticket and no other run has one; a resolved ticket "
    "says how and when; a re-plan is awaited exactly while the run holds itself open for it",
)
def escalations_consistent() -> list[str]:
    open_ticket = Exists(
        EscalationTicket.objects.filter(run=OuterRef("pk")).exclude(
            status=EscalationStatus.RESOLVED
        )
    )
    problems = _ids(
        Run.objects.filter(status=RunStatus.ESCALATED).exclude(open_ticket),
        "run {pk}: escalated without an open ticket",
    )
    problems += _ids(
        Run.objects.exclude(status=RunStatus.ESCALATED).filter(open_ticket),
        "run {pk}: an open ticket, but the run is not escalated",
    )
    problems += [
        f"escalation {pk}: resolved without a resolution or a time"
        for pk in EscalationTicket.objects.filter(status=EscalationStatus.RESOLVED)
        .filter(Q(resolution="") | Q(resolved_at__isnull=True))
        .values_list("pk", flat=True)[:LIMIT]
    ]
    awaited = Exists(Replan.objects.filter(run=OuterRef("pk"), status=ReplanStatus.REQUESTED))
    problems += _ids(
        Run.objects.filter(replan_pending_since__isnull=False).exclude(awaited),
        "run {pk}: holds itself open for a re-plan nobody asked for",
    )
    problems += _ids(
        Run.objects.filter(replan_pending_since__isnull=True).filter(awaited),
        "run {pk}: a re-plan is asked for but the run does not wait for it",
    )
    return problems


@invariant(
    "runs.attempt_charges",
    "per run attempt: its steps' costs add up to what its reservation charged (settled, "
    "to its ledger charge: billing.reservations)",
)
def attempt_charges() -> list[str]:
    """Set-based: one statement (``charged_unlike_costs``)."""
    return [
        f"run {run_id} attempt {number}: charged {charged} but its steps cost {costs}"
        for run_id, number, charged, costs in charged_unlike_costs(Reservation.objects.all())
    ]


def charged_unlike_costs(
    reservations: QuerySet[Reservation],
) -> list[tuple[Any, int, Decimal, Decimal]]:
    """Those of ``reservations`` whose ``charged`` is not what their attempt's steps cost
    (at most LIMIT): run, attempt number, charged, costs. Each step attempt's cost is
    added to its row in the transaction that draws it on the reservation, and only there
    (docs/engine.md, "Billing"): a charge drawn twice, or drawn without its recording,
    shows here (``make chaos`` counts these as charged twice)."""
    costs = (
        Step.objects.filter(run_id=OuterRef("run_id"), attempt_number=OuterRef("attempt_number"))
        .order_by()
        .values("run_id")
        .annotate(total=Sum("cost"))
        .values("total")
    )
    off = reservations.annotate(
        costs=Coalesce(Subquery(costs, output_field=DecimalField()), Decimal(0))
    ).exclude(charged=F("costs"))
    return list(off.values_list("run_id", "attempt_number", "charged", "costs")[:LIMIT])


@invariant(
    "runs.borrowed_steps_uncharged",
    "a step completed with a reused or cached output ran no tool: it costs nothing, and "
    "no charge entry of an attempt opened before charges were counted names it",
)
def borrowed_steps_uncharged() -> list[str]:
    charges = LedgerEntry.objects.filter(step_id=OuterRef("pk"), type=EntryType.CHARGE)
    charged = Step.objects.filter(
        Q(reused_from__isnull=False) | Q(cached_from__isnull=False),
        Q(cost__gt=0) | Exists(charges),
    )
    return [
        f"step {pk} (run {run_id}): reused or cached, yet charged"
        for pk, run_id in charged.values_list("pk", "run_id")[:LIMIT]
    ]
