"""Re-plans answered (docs/escalation.md#re-plan): the planner consulted outside any
transaction, then, under the run's lock, its fragment validated with the rest of the
plan, paid for, and spawned into the running attempt.

A re-plan is asked for by the engine (``runs.engine.policy.consider_replan``: too many
agents or tasks failed) or by an operator resolving an escalation
(``runs.people.escalations``); either way a ``Replan`` row waits in `requested` and the run is
held open by one extra open child. ``replan_run`` (the worker's ``orchestrator.runs.
replan`` task) answers it once: a duplicate message finds it answered and does nothing.

What comes of it:

- agents proposed and valid: their cost (the worst case of their steps) is reserved on
  the attempt's reservation first; they are created after the attempt's agents and
  dispatched; the hold becomes them. Every re-plan is an event with its fragment.
- nothing proposed, or the answer refused (not JSON, not a plan, a planner error): a
  recorded planning failure, never a crash. The hold is released and the run goes on
  as it would have; when an operator's re-plan had replaced failing agents, there is
  nothing to go on with, and the run fails with `replan_failed`.
- the credits do not cover the new agents: the run fails with `insufficient_credits`
  (an abort).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.models import F, Max
from django.utils import timezone

from billing.models import Organization
from billing.services import InsufficientCredits, credits_reserve_more
from runs import services
from runs.engine.dispatch import dispatch
from runs.engine.policy import replan_limits
from runs.engine.propagation import finish_if_done
from runs.materialize import add_agents, wiring
from runs.models import Agent, EventKind, Mode, Replan, ReplanStatus, ReplanTrigger, Run
from runs.outbox import Outbox
from runs.people.planners import Planner, PlanningFailed, PlanningRequest, limits_for, proposal_of
from runs.plan import AgentPlan, Limits, PlanInvalid, parse_plan
from runs.reservation import agents_reservation
from runs.states import NodeStatus, RunStatus
from runs.transitions import record_event, transition

logger = logging.getLogger(__name__)

PlannerFor = Callable[[str], Planner]
# An agent a new one may wait for: it has completed, or still may.
WAITABLE = (NodeStatus.COMPLETED, NodeStatus.PENDING, NodeStatus.RUNNING, NodeStatus.PAUSED)


def planning_request(run: Run, replan: Replan) -> PlanningRequest:
    """What the planner of ``replan`` is told."""
    plan = services.replanned_plan_json(run)
    agents = [
        {"name": name, "status": status}
        for name, status in Agent.objects.filter(run=run, attempt_number=replan.attempt_number)
        .order_by("position")
        .values_list("name", "status")
    ]
    available = Organization.objects.values_list("credits_available", flat=True).get(
        pk=run.organization_id
    )
    limits = limits_for(
        plan,
        Limits.from_settings(),
        credits_available=str(available),
        replans_left=max(replan_limits(run).max_replans - replan.number, 0),
    )
    return PlanningRequest(
        run_id=str(run.pk),
        replan=replan.number,
        trigger=replan.trigger,
        plan=plan,
        failures=replan.failures,
        agents=agents,
        limits=limits,
    )


def replan_run(run_id: Any, planner_for: PlannerFor) -> str:
    """Answer the run's re-plan that waits, if any; return what came of it ("" when
    there was none: a duplicate message, or answered already)."""
    replan = (
        Replan.objects.filter(run_id=run_id, status=ReplanStatus.REQUESTED)
        .order_by("number")
        .first()
    )
    if replan is None:
        return ""
    run = Run.objects.get(pk=run_id)
    proposal: list[dict[str, Any]] = []
    usage: dict[str, Any] | None = None
    failed: PlanningFailed | None = None
    try:
        answer = proposal_of(planner_for(replan.planner)(planning_request(run, replan)))
        proposal, usage = answer.agents, answer.usage
    except PlanningFailed as exc:
        failed = exc
    except Exception as exc:  # a planner is plug-in code: whatever it raises is recorded
        logger.warning("planner %s failed for run %s", replan.planner, run_id, exc_info=True)
        failed = PlanningFailed("planner_error", f"{type(exc).__name__}: {exc}"[:2000])
    return _answer(run_id, replan.pk, proposal, usage, failed)


@transaction.atomic
def _answer(
    run_id: Any,
    replan_id: int,
    proposal: list[dict[str, Any]],
    usage: dict[str, Any] | None,
    failed: PlanningFailed | None,
) -> str:
    run = services.lock_run(run_id)
    replan = Replan.objects.select_for_update().get(pk=replan_id)
    if replan.status != ReplanStatus.REQUESTED:
        return ""  # answered meanwhile (a duplicate), or dropped with the run's end
    now = timezone.now()
    replan.usage = usage
    if run.status in (RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED):
        _finish(replan, ReplanStatus.DROPPED, now)
        return ReplanStatus.DROPPED
    if failed is None and not proposal:
        _settle(run, replan, ReplanStatus.EMPTY, None, now)
        return ReplanStatus.EMPTY
    if failed is None:
        try:
            _spawn(run, replan, proposal, now)
            return ReplanStatus.SPAWNED
        except PlanningFailed as exc:
            failed = exc
        except InsufficientCredits as exc:
            replan.fragment = proposal
            _finish(
                replan,
                ReplanStatus.FAILED,
                now,
                {"code": "insufficient_credits", "message": str(exc)},
            )
            _event(run, replan, f"re-plan {replan.number} refused: {exc}")
            services.run_fail(
                run_id=run.pk,
                code="insufficient_credits",
                message=f"re-plan {replan.number} needs more credits than are available: {exc}",
                actor="engine",
            )
            return ReplanStatus.FAILED
    assert failed is not None
    replan.fragment = proposal or None
    _settle(run, replan, ReplanStatus.FAILED, failed.as_error(), now)
    return ReplanStatus.FAILED


def _finish(
    replan: Replan, status: str, now: datetime, error: dict[str, Any] | None = None
) -> None:
    replan.status, replan.error, replan.finished_at = status, error, now
    replan.save(
        update_fields=["status", "error", "finished_at", "fragment", "usage", "agents", "cost"]
    )


def _event(run: Run, replan: Replan, message: str, **payload: Any) -> None:
    record_event(
        run,
        EventKind.REPLAN,
        actor="engine",
        message=message,
        payload={
            "replan": replan.number,
            "status": replan.status,
            "planner": replan.planner,
            "fragment": replan.fragment,
            "error": replan.error,
            **payload,
        },
    )


def _release_hold(run: Run) -> None:
    Run.objects.filter(pk=run.pk).update(
        open_children=F("open_children") - 1, replan_pending_since=None
    )
    run.refresh_from_db(
        fields=["open_children", "active_children", "status", "replan_pending_since"]
    )


def _settle(
    run: Run, replan: Replan, status: str, error: dict[str, Any] | None, now: datetime
) -> None:
    """Nothing to spawn: the hold is released and the run goes on as it would have;
    unless the re-plan replaced failing agents (an operator's), which leaves nothing to
    go on with: the run fails with `replan_failed`."""
    _finish(replan, status, now, error)
    what = "proposed nothing" if status == ReplanStatus.EMPTY else f"failed: {error}"
    _event(run, replan, f"re-plan {replan.number}: the planner {what}")
    _release_hold(run)
    if replan.failures.get("superseded"):
        reason = "the planner proposed nothing" if error is None else error["message"]
        services.run_fail(
            run_id=run.pk,
            code="replan_failed",
            message=f"re-plan {replan.number} replaced failing agents, and {reason}"[:2000],
            actor="engine",
        )
        return
    finish_if_done(run)


# --------------------------------------------------------------------------- spawning
def _spawn(run: Run, replan: Replan, proposal: list[dict[str, Any]], now: datetime) -> None:
    base = services.replanned_plan_json(run)
    known = len(base["agents"])
    try:
        typed = parse_plan({**base, "agents": [*base["agents"], *proposal]})
    except PlanInvalid as exc:
        problems = [_in_fragment(error.path, error.message, known) for error in exc.errors]
        raise PlanningFailed(
            "invalid_plan", f"the proposed agents are not a valid plan: {exc}"[:2000], problems
        ) from None
    plans = list(typed.agents[known:])
    status = dict(
        Agent.objects.filter(run=run, attempt_number=run.attempt_number).values_list(
            "name", "status"
        )
    )
    problems = [
        {
            "path": f"agents[{index}].depends_on",
            "message": f"{dep!r} ended {status[dep]}: it will never complete",
        }
        for index, plan in enumerate(plans)
        for dep in plan.depends_on
        if dep in status and status[dep] not in WAITABLE
    ]
    if problems:
        raise PlanningFailed(
            "invalid_plan", "the proposed agents wait for agents that failed", problems
        )
    replan.fragment = proposal
    cost = agents_reservation(plans)
    if cost > 0:
        credits_reserve_more(
            organization_id=run.organization_id,
            run_id=run.pk,
            attempt_number=run.attempt_number,
            amount=cost,
            key=f"replan:{replan.number}",
            reason=f"run {run.pk} attempt {run.attempt_number} re-plan {replan.number}",
            actor="engine",
        )
    wired = _wire(run, plans, status)
    attempt = services.current_attempt(run)
    last = Agent.objects.filter(run=run, attempt_number=run.attempt_number).aggregate(
        last=Max("position")
    )["last"]
    added = add_agents(run, attempt, plans, wired, (last if last is not None else -1) + 1)
    names = [plan.name for plan in plans]
    # The hold becomes the new agents (one open child each).
    Run.objects.filter(pk=run.pk).update(
        agent_count=F("agent_count") + added,
        open_children=F("open_children") + added - 1,
        replan_pending_since=None,
    )
    replan.agents, replan.cost = names, cost
    _finish(replan, ReplanStatus.SPAWNED, now)
    _event(
        run,
        replan,
        f"re-plan {replan.number} spawned {', '.join(names)}",
        agents=names,
        cost=str(cost),
    )
    run.refresh_from_db()
    if run.status == RunStatus.WAITING_APPROVAL:
        # Approvals are no longer all it waits for.
        run = transition(Run, run.pk, RunStatus.RUNNING, actor="engine", message="re-planned").obj
    dispatch(run, run, Outbox())


def _wire(
    run: Run, plans: Sequence[AgentPlan], status: Mapping[str, str]
) -> list[tuple[int, list[str]]]:
    """The new agents' dependency counts and dependents. In a sequential run they run in
    sequence among themselves, from now; in a dag they wait for what they name, and an
    agent of the attempt they name (still open) learns to release them."""
    names = [plan.name for plan in plans]
    if run.mode != Mode.DAG:
        return wiring(run.mode, names, [() for _ in plans])
    own = set(names)
    dependents: dict[str, list[str]] = {name: [] for name in names}
    outside: dict[str, list[str]] = {}
    pending = []
    for plan in plans:
        count = 0
        for dep in plan.depends_on:
            if dep in own:
                dependents[dep].append(plan.name)
                count += 1
            elif status.get(dep) != NodeStatus.COMPLETED:
                outside.setdefault(dep, []).append(plan.name)
                count += 1
        pending.append(count)
    for agent in Agent.objects.select_for_update(no_key=True).filter(
        run=run, attempt_number=run.attempt_number, name__in=list(outside)
    ):
        agent.dependents = [*agent.dependents, *outside[agent.name]]
        agent.save(update_fields=["dependents"])
    return [(count, dependents[name]) for count, name in zip(pending, names, strict=True)]


def _in_fragment(path: str, message: str, known: int) -> dict[str, str]:
    """A problem of the merged plan, its path in the fragment (``agents[k]`` counts the
    proposed agents from 0)."""
    prefix = "agents["
    if path.startswith(prefix):
        index, _, rest = path[len(prefix) :].partition("]")
        if index.isdigit() and int(index) >= known:
            return {"path": f"agents[{int(index) - known}]{rest}", "message": message}
    return {"path": path, "message": message}


__all__ = ["PlannerFor", "ReplanTrigger", "planning_request", "replan_run"]
