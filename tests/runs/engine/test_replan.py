"""Re-plans, in process: the triggers, the rule planner and the LLM planner (against a
local OpenAI-compatible server), a bad answer recorded and never a crash, the cap, the
credits, and an operator's re-plan of an escalated run."""

from __future__ import annotations

import json
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest

from billing.models import LedgerEntry, Reservation
from common.invariants import violations
from runs.models import Agent, EscalationTicket, Replan
from runs.outbox import RunMessage
from runs.people import escalations, replanning
from runs.people.planners import PlanningRequest, planner_named, rule_planner
from runs.selectors import run_history
from tests import factories
from tests.http_fixture import HttpServer
from tests.runs.engine.harness import EngineRun

Start = Callable[..., EngineRun]


@pytest.fixture
def start(engine_run: Start) -> Start:
    return engine_run


def agent(name: str, *steps: str, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "tasks": [{"name": "t", "steps": [{"name": s, "tool": "noop"} for s in steps]}],
        **extra,
    }


def continuing(*agents: dict[str, Any], **run: Any) -> dict[str, Any]:
    """A run that goes on when an agent fails (the re-plan triggers need one)."""
    return {"name": "replan", "failure_mode": "continue", "agents": list(agents), **run}


def assert_invariants_hold() -> None:
    assert violations() == {}


def answer(run: EngineRun, planner: Callable[[str], Any] = planner_named) -> str:
    """The worker's replan task, in this process."""
    with run.committed():
        return replanning.replan_run(run.run.pk, planner)


# --------------------------------------------------------------------------- triggers
def test_more_than_half_of_the_agents_failing_asks_the_planner_once(start: Start) -> None:
    run = start(continuing(agent("a", "s"), agent("b", "s"), agent("c", "s")))
    a, b = (Agent.objects.get(run=run.run, name=name) for name in ("a", "b"))
    run.finish_step(run.step_in("a", "s"), run.failure("invalid_input"))
    assert not Replan.objects.exists()  # 1 of 3

    run.finish_step(run.step_in("b", "s"), run.failure("invalid_input"))  # 2 of 3

    replan = Replan.objects.get(run=run.run)
    assert (replan.number, replan.trigger, replan.planner, replan.status) == (
        1,
        "agents_failed",
        "rules",
        "requested",
    )
    assert sorted(entry["agent"] for entry in replan.failures["agents"]) == ["a", "b"]
    assert run.run_messages(RunMessage.REPLAN) == 1
    current = run.refresh()
    assert (current.replan_count, current.replan_pending_since is not None) == (1, True)
    assert {a.pk, b.pk} == set(Agent.objects.filter(status="skipped").values_list("pk", flat=True))
    assert_invariants_hold()


def test_the_hold_keeps_a_run_whose_agents_all_failed_from_completing(start: Start) -> None:
    run = start(continuing(agent("only", "s")))
    run.finish_step(run.step_in("only", "s"), run.failure("invalid_input"))

    assert run.refresh().status == "running"  # waiting for its planner, not completed
    assert answer(run) == "spawned"
    assert Agent.objects.filter(run=run.run, name="only-replan1").exists()
    run.finish_step(run.step_in("only-replan1", "s"))
    assert run.refresh().status == "completed"
    assert_invariants_hold()


def test_more_than_ten_failed_tasks_ask_for_a_re_plan(start: Start) -> None:
    tasks = [{"name": f"t{i}", "steps": [{"name": "s", "tool": "noop"}]} for i in range(3)]
    spec = {
        "name": "tasks",
        "replan": {"task_failures": 2, "agent_failure_ratio": 1.0},
        "agents": [
            {"name": "a", "mode": "parallel", "failure_mode": "continue", "tasks": tasks},
            agent("b", "s"),
        ],
    }
    run = start(spec)
    for i in range(2):
        run.finish_step(run.step_in("a", "s", task=f"t{i}"), run.failure("invalid_input"))
    assert not Replan.objects.exists()
    run.finish_step(run.step_in("a", "s", task="t2"), run.failure("invalid_input"))
    assert Replan.objects.get(run=run.run).trigger == "tasks_failed"


def test_a_fail_fast_run_is_not_re_planned(start: Start) -> None:
    run = start({"name": "ff", "agents": [agent("a", "s"), agent("b", "s")]})
    run.finish_step(run.step_in("a", "s"), run.failure("invalid_input"))
    assert run.refresh().status == "failed"
    assert not Replan.objects.exists()


# --------------------------------------------------------------------------- rule planner
def test_the_rule_planner_reruns_failed_agents_widened_and_continuing(start: Start) -> None:
    spec = continuing(
        {
            "name": "a",
            "tasks": [
                {
                    "name": "t",
                    "steps": [
                        {"name": "s", "tool": "noop", "retry": {"max_attempts": 2}},
                        {"name": "ok", "tool": "noop"},
                    ],
                }
            ],
        },
        agent("b", "s"),
        replan={"agent_failure_ratio": 0.4},
    )
    run = start(spec)
    run.finish_step(run.step_in("a", "s"), run.failure("invalid_input"))
    before = Reservation.objects.get(run_id=run.run.pk).reserved

    assert answer(run) == "spawned"

    replan = Replan.objects.get(run=run.run)
    assert replan.agents == ["a-replan1"]
    copy = replan.fragment[0]
    assert copy["failure_mode"] == "continue"
    assert copy["tasks"][0]["failure_mode"] == "continue"
    assert copy["tasks"][0]["steps"][0]["retry"]["max_attempts"] == 4
    assert "retry" not in copy["tasks"][0]["steps"][1]  # only the failed step is widened
    # Its cost was reserved first, on the attempt's reservation.
    # The worst case of its steps: 4 attempts of "s" and 3 of "ok", at 0.01 each.
    assert replan.cost == Decimal("0.07")
    extra = LedgerEntry.objects.get(idempotency_key__endswith=":replan:1")
    assert (extra.type, extra.amount) == ("reserve", replan.cost)
    assert Reservation.objects.get(run_id=run.run.pk).reserved == before + replan.cost
    event = run_history(run.run).get(kind="replan", payload__status="spawned")
    assert event.payload["fragment"] == replan.fragment
    # It runs and the run completes, its books settled.
    run.finish_step(run.step_in("b", "s"))
    run.finish_step(run.step_in("a-replan1", "s"))
    run.finish_step(run.step_in("a-replan1", "ok"))
    assert run.refresh().status == "completed"
    assert Reservation.objects.get(run_id=run.run.pk).settled_at is not None
    assert_invariants_hold()


def test_the_rule_planner_knows_one_remedy() -> None:
    request = PlanningRequest(
        run_id="r",
        replan=2,
        trigger="agents_failed",
        plan={"agents": [agent("a", "s")]},
        failures={"agents": [{"agent": "a", "code": "x", "message": "y"}]},
        agents=[{"name": "a", "status": "skipped"}],
        limits={"max_retry_attempts": 10},
    )
    assert rule_planner(request) is None


def test_the_cap_stops_asking(start: Start) -> None:
    spec = continuing(agent("a", "s"), replan={"max_replans": 1})
    run = start(spec)
    run.finish_step(run.step_in("a", "s"), run.failure("invalid_input"))
    answer(run)
    run.finish_step(run.step_in("a-replan1", "s"), run.failure("invalid_input"))

    assert Replan.objects.filter(run=run.run).count() == 1
    assert run.refresh().status == "completed"  # every agent skipped under continue
    assert run.run.replan_count == 1


def test_a_re_plan_the_credits_cannot_cover_fails_the_run(start: Start) -> None:
    organization = factories.org(credits="1")
    spec = continuing(agent("a", "s"), agent("b", "s"), credits="1")
    run = start(spec, organization=organization)
    run.finish_step(run.step_in("a", "s"), run.failure("invalid_input"))
    run.finish_step(run.step_in("b", "s"), run.failure("invalid_input"))

    assert answer(run) == "failed"

    current = run.refresh()
    assert current.status == "failed"
    assert current.last_error["code"] == "insufficient_credits"
    replan = Replan.objects.get(run=run.run)
    assert replan.error["code"] == "insufficient_credits"
    assert not LedgerEntry.objects.filter(idempotency_key__contains=":replan:").exists()
    assert Reservation.objects.get(run_id=current.pk).settled_at is not None
    assert_invariants_hold()


# --------------------------------------------------------------------------- LLM planner
@pytest.fixture
def llm(http_server: HttpServer, settings: Any) -> HttpServer:
    settings.LLM_BASE_URL = http_server.llm_base_url
    return http_server


def llm_run(start: Start) -> EngineRun:
    run = start(continuing(agent("a", "s"), replan={"planner": "llm"}))
    run.finish_step(run.step_in("a", "s"), run.failure("invalid_input", "the source is gone"))
    assert Replan.objects.get(run=run.run).planner == "llm"
    return run


def test_the_llm_planner_spawns_what_the_model_proposes(start: Start, llm: HttpServer) -> None:
    proposal = {"agents": [agent("fallback", "fetch", "summarise")]}
    llm.chat_completion("```json\n" + json.dumps(proposal) + "\n```", total_tokens=120)
    run = llm_run(start)

    assert answer(run) == "spawned"

    sent = llm.requests[-1].json()
    question = json.loads(sent["messages"][1]["content"])
    assert question["failures"]["agents"][0] == {
        "agent": "a",
        "code": "invalid_input",
        "message": "the source is gone",
    }
    assert question["plan"]["agents"][0]["name"] == "a"
    replan = Replan.objects.get(run=run.run)
    assert (replan.agents, replan.usage["total_tokens"]) == (["fallback"], 120)
    run.finish_step(run.step_in("fallback", "fetch"))
    run.finish_step(run.step_in("fallback", "summarise"))
    assert run.refresh().status == "completed"
    assert_invariants_hold()


def test_an_answer_that_is_not_json_is_a_recorded_planning_failure(
    start: Start, llm: HttpServer
) -> None:
    llm.chat_completion("I would retry the agent with more patience.")
    run = llm_run(start)

    assert answer(run) == "failed"

    replan = Replan.objects.get(run=run.run)
    assert replan.error["code"] == "invalid_json"
    # The hold released, the run went on: its only agent was skipped, it completes.
    assert run.refresh().status == "completed"
    assert run.run.replan_pending_since is None
    assert run_history(run.run).filter(kind="replan", payload__status="failed").exists()
    assert_invariants_hold()


def test_an_answer_that_is_not_a_valid_plan_is_refused_with_its_problems(
    start: Start, llm: HttpServer
) -> None:
    bad = {
        "agents": [
            {"name": "a", "tasks": [{"name": "t", "steps": [{"name": "s", "tool": "teleport"}]}]}
        ]
    }
    llm.chat_completion(json.dumps(bad))
    run = llm_run(start)

    assert answer(run) == "failed"

    error = Replan.objects.get(run=run.run).error
    assert error["code"] == "invalid_plan"
    paths = {problem["path"] for problem in error["problems"]}
    assert "agents[0].tasks[0].steps[0].tool" in paths  # the fragment's own path
    assert any("duplicate" in problem["message"] for problem in error["problems"])
    assert not Agent.objects.filter(run=run.run, position__gte=1).exists()
    assert run.refresh().status == "completed"
    assert_invariants_hold()


def test_an_llm_that_is_down_is_a_planning_failure(start: Start, llm: HttpServer) -> None:
    llm.chat_completion(status=503)
    run = llm_run(start)
    assert answer(run) == "failed"
    assert Replan.objects.get(run=run.run).error["code"] == "planner_error"


def test_a_planner_that_raises_is_recorded_not_a_crash(start: Start) -> None:
    run = start(continuing(agent("a", "s")))
    run.finish_step(run.step_in("a", "s"), run.failure("invalid_input"))

    def broken(name: str) -> Any:
        def planner(request: PlanningRequest) -> Any:
            raise RuntimeError("planner bug")

        return planner

    assert answer(run, broken) == "failed"
    assert Replan.objects.get(run=run.run).error == {
        "code": "planner_error",
        "message": "RuntimeError: planner bug",
    }
    assert answer(run) == ""  # answered once: a duplicate message does nothing


# --------------------------------------------------------------------------- operator
def test_an_operator_re_plan_replaces_the_failing_agent(start: Start) -> None:
    retry = {"max_attempts": 1, "on_exhausted": "escalate"}
    spec = {
        "name": "op",
        "agents": [
            {
                "name": "a",
                "tasks": [{"name": "t", "steps": [{"name": "s", "tool": "noop", "retry": retry}]}],
            },
            agent("b", "s"),
        ],
    }
    run = start(spec)
    run.finish_step(run.step_in("a", "s"), run.failure("timeout", retryable=True))
    assert run.refresh().status == "escalated"
    ticket = EscalationTicket.objects.get(run=run.run)

    with run.committed():
        escalations.escalation_resolve(ticket_id=ticket.pk, action="replan", actor="ops")

    original = Agent.objects.get(run=run.run, name="a")
    assert (original.status, original.last_error["code"]) == ("skipped", "replanned")
    assert run.refresh().status == "running"
    assert answer(run) == "spawned"
    for name in ("a-replan1", "b"):
        run.finish_step(run.step_in(name, "s"))
    assert run.refresh().status == "completed"
    assert_invariants_hold()


def test_an_operator_re_plan_the_planner_declines_fails_the_run(start: Start) -> None:
    retry = {"max_attempts": 1, "on_exhausted": "escalate"}
    spec = {
        "name": "op",
        "replan": {"max_replans": 2},
        "agents": [
            {
                "name": "a",
                "tasks": [{"name": "t", "steps": [{"name": "s", "tool": "noop", "retry": retry}]}],
            }
        ],
    }
    run = start(spec)
    run.finish_step(run.step_in("a", "s"), run.failure("timeout", retryable=True))
    ticket = EscalationTicket.objects.get(run=run.run)
    escalations.escalation_resolve(ticket_id=ticket.pk, action="replan", actor="ops")

    assert answer(run, lambda name: lambda request: None) == "empty"

    current = run.refresh()
    assert (current.status, current.last_error["code"]) == ("failed", "replan_failed")
    assert_invariants_hold()


def test_an_operator_re_plan_past_the_cap_is_refused(start: Start) -> None:
    retry = {"max_attempts": 1, "on_exhausted": "escalate"}
    spec = {
        "name": "op",
        "replan": {"max_replans": 0},
        "agents": [
            {
                "name": "a",
                "tasks": [{"name": "t", "steps": [{"name": "s", "tool": "noop", "retry": retry}]}],
            }
        ],
    }
    run = start(spec)
    run.finish_step(run.step_in("a", "s"), run.failure("timeout", retryable=True))
    ticket = EscalationTicket.objects.get(run=run.run)
    with pytest.raises(escalations.ReplanLimitReached):
        escalations.escalation_resolve(ticket_id=ticket.pk, action="replan", actor="ops")
    assert run.refresh().status == "escalated"
    assert EscalationTicket.objects.get(pk=ticket.pk).status == "open"
