"""Escalation, abort and re-plan end to end: a real Celery worker, Redis and PostgreSQL.

Each trigger (time travel where the window matters), on-call told by a signed webhook to
a local server (retried after a 500), every resolution over the API, the escalated
timeout, re-plans by the rule planner and by the LLM planner (the session's local
OpenAI-compatible server), and each abort condition with its ledger settled."""

from __future__ import annotations

import hashlib
import hmac
import json
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from billing.secrets import oncall_set
from orchestrator import sweeps
from runs.models import EscalationTicket, Notification, Replan, Run, StepFailure
from tests.http_fixture import HttpServer
from tests.integration.engine_support import assert_books_balanced, steps_of, wait_for
from tests.support import wait_until
from tests.tenants import Tenant, make_tenant

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

QUICK = {"backoff": "fixed", "base_delay_ms": 0, "jitter": 0}
SECRET = "integration-secret"
ESCALATED = ("escalated",)


def flaky(name: str, fails: int, code: str = "timeout", **retry: Any) -> dict[str, Any]:
    """A step whose first ``fails`` attempts fail with ``code``."""
    return {
        "name": name,
        "tool": "fail",
        "params": {"code": code, "until_attempt": fails},
        "retry": {"max_attempts": 20, **QUICK, **retry},
    }


def noop(name: str) -> dict[str, Any]:
    return {"name": name, "tool": "noop"}


def one_agent(*steps: dict[str, Any], **run: Any) -> dict[str, Any]:
    return {
        "name": "escalating",
        "agents": [{"name": "a", "tasks": [{"name": "t", "steps": list(steps)}]}],
        **run,
    }


def submit(tenant: Tenant, spec: dict[str, Any]) -> Run:
    response = tenant.post("/api/v1/runs", {"plan": spec, "start": True})
    assert response.status_code == 201, response.json()
    return Run.objects.get(pk=response.json()["id"])


def ticket_of(run: Run) -> EscalationTicket:
    return EscalationTicket.objects.filter(run=run).latest("opened_at")


def resolve(tenant: Tenant, run: Run, action: str) -> dict[str, Any]:
    response = tenant.post(f"/api/v1/escalations/{ticket_of(run).pk}/resolve", {"action": action})
    assert response.status_code == 200, response.json()
    body: dict[str, Any] = response.json()
    return body


# --------------------------------------------------------------------------- triggers
def test_a_burst_escalates_and_on_call_gets_a_signed_webhook_retried_after_a_500(
    celery_worker: str, http_server: HttpServer
) -> None:
    http_server.respond("/pager", status=500, times=1)
    http_server.respond("/pager", status=200, json={"ok": True})
    tenant = make_tenant()
    oncall_set(
        organization=tenant.organization,
        webhook_url=f"{http_server.url}/pager",
        webhook_secret=SECRET,
    )
    run = submit(tenant, one_agent(flaky("flaky", fails=50)))

    wait_for(run, ESCALATED)
    ticket = ticket_of(run)
    assert (ticket.reason, len(ticket.errors)) == ("error_burst", 6)
    assert steps_of(run)["flaky"].status == "pending"  # held, not failed
    wait_until(
        lambda: EscalationTicket.objects.get(pk=ticket.pk).notified_at,
        timeout=30,
        what="on-call to be told",
    )

    first, second = http_server.requests
    for request in (first, second):
        parts = dict(
            item.split("=", 1) for item in request.headers["x-orchestrator-signature"].split(",")
        )
        signed = f"{parts['t']}.".encode() + request.body
        assert hmac.compare_digest(
            parts["v1"], hmac.new(SECRET.encode(), signed, hashlib.sha256).hexdigest()
        )
        assert abs(int(parts["t"]) - timezone.now().timestamp()) < 60  # fresh: not a replay
    assert json.loads(second.body)["escalation"]["id"] == str(ticket.pk)
    deliveries = Notification.objects.filter(ticket=ticket).order_by("attempt")
    assert [(n.attempt, n.delivered, n.status_code) for n in deliveries] == [
        (1, False, 500),
        (2, True, 200),
    ]
    listed = tenant.get("/api/v1/escalations", {"run": str(run.pk)}).json()["results"]
    assert [item["id"] for item in listed] == [str(ticket.pk)]
    assert resolve(tenant, run, "cancel")["resolution"] == "cancel"
    wait_for(run)
    assert_books_balanced(run)


def test_failures_that_left_the_window_do_not_count(celery_worker: str) -> None:
    tenant = make_tenant()
    spec = one_agent(
        flaky("before", fails=3), {"name": "ask", "tool": "approval"}, flaky("after", fails=3)
    )

    counted = submit(tenant, spec)
    forgotten = submit(tenant, spec)
    for run in (counted, forgotten):
        wait_for(run, ("waiting_approval",))
    # Time travel: the first run's three failures happened six minutes ago.
    StepFailure.objects.filter(run=forgotten).update(
        created_at=timezone.now() - timedelta(minutes=6)
    )
    for run in (counted, forgotten):
        assert tenant.post(f"/api/v1/runs/{run.pk}/approve", {}).status_code == 200

    assert wait_for(forgotten).status == "completed"
    assert wait_for(counted, ESCALATED).status == "escalated"  # six in five minutes
    assert ticket_of(counted).reason == "error_burst"
    resolve(tenant, counted, "resume")
    assert wait_for(counted).status == "completed"
    for run in (counted, forgotten):
        assert_books_balanced(run)


@pytest.mark.parametrize(
    ("steps", "escalation", "reason"),
    [
        (
            [*(noop(f"ok{i}") for i in range(5)), flaky("flaky", fails=50)],
            {"max_errors": 100},
            "error_rate",
        ),
        (
            [flaky("slow", fails=50, backoff="exponential", base_delay_ms=100, max_delay_ms=300)],
            {},
            "backoff_exceeded",
        ),
        (
            [flaky("spent", fails=50, max_attempts=2, on_exhausted="escalate")],
            {},
            "attempts_exhausted",
        ),
    ],
    ids=["error_rate", "backoff_exceeded", "attempts_exhausted"],
)
def test_each_trigger_escalates_with_its_reason(
    celery_worker: str, steps: list[dict[str, Any]], escalation: dict[str, Any], reason: str
) -> None:
    tenant = make_tenant()
    run = submit(tenant, one_agent(*steps, escalation=escalation))

    wait_for(run, ESCALATED)

    assert ticket_of(run).reason == reason
    resolve(tenant, run, "cancel")
    assert wait_for(run).status == "cancelled"
    assert_books_balanced(run)


def test_a_non_retryable_error_aborts_without_escalating(celery_worker: str) -> None:
    tenant = make_tenant()
    run = submit(
        tenant, one_agent(flaky("bad", fails=50, code="invalid_input", on_exhausted="escalate"))
    )
    done = wait_for(run)
    assert (done.status, done.last_error["code"]) == ("failed", "invalid_input")
    assert not EscalationTicket.objects.filter(run=run).exists()
    assert_books_balanced(run)


# --------------------------------------------------------------------------- resolving
def exhausted(tenant: Tenant, fails: int = 3) -> Run:
    spec = one_agent(
        flaky("flaky", fails=fails, max_attempts=2, on_exhausted="escalate"), noop("after")
    )
    run = submit(tenant, spec)
    wait_for(run, ESCALATED)
    return run


def test_resume_over_the_api_carries_on_with_fresh_retries(celery_worker: str) -> None:
    tenant = make_tenant()
    run = exhausted(tenant)

    body = resolve(tenant, run, "resume")

    assert (body["status"], body["resolution"]) == ("resolved", "resume")
    done = wait_for(run)
    assert done.status == "completed", done.last_error
    assert steps_of(run)["flaky"].attempts == 4  # two, held, then two more: the last succeeds
    assert_books_balanced(run)


def test_retry_over_the_api_starts_a_new_attempt(celery_worker: str) -> None:
    tenant = make_tenant()
    run = exhausted(tenant)

    resolve(tenant, run, "retry")

    # The new attempt fails the same way, and escalates on its own ticket.
    wait_until(
        lambda: EscalationTicket.objects.filter(run=run, attempt_number=2).exists(),
        timeout=30,
        what="the second attempt to escalate",
    )
    assert [
        t.resolution for t in EscalationTicket.objects.filter(run=run).order_by("opened_at")
    ] == [
        "retry",
        "",
    ]
    resolve(tenant, run, "cancel")
    done = wait_for(run)
    assert (done.status, done.attempt_number) == ("cancelled", 2)
    assert_books_balanced(run)


def test_replan_over_the_api_replaces_the_failing_agent(celery_worker: str) -> None:
    tenant = make_tenant()
    run = exhausted(tenant)

    resolve(tenant, run, "replan")

    done = wait_for(run)
    assert done.status == "completed", done.last_error
    replan = Replan.objects.get(run=run)
    assert (replan.trigger, replan.status, replan.agents) == ("operator", "spawned", ["a-replan1"])
    body = tenant.get(f"/api/v1/runs/{run.pk}").json()
    assert body["replan_count"] == 1
    assert_books_balanced(run)


def test_cancel_over_the_api_cancels_and_refunds(celery_worker: str) -> None:
    tenant = make_tenant()
    run = exhausted(tenant)

    resolve(tenant, run, "cancel")

    done = wait_for(run)
    assert (done.status, done.last_error["code"]) == ("cancelled", "cancelled")
    assert_books_balanced(run)


def test_an_escalated_run_nobody_resolves_fails_after_its_timeout(celery_worker: str) -> None:
    tenant = make_tenant()
    spec = one_agent(
        flaky("flaky", fails=3, max_attempts=1, on_exhausted="escalate"),
        timeouts={"escalated": "10m"},
    )
    run = submit(tenant, spec)
    wait_for(run, ESCALATED)

    # Time travel: the sweep looks eleven minutes on.
    counts = sweeps.sweep_timeouts(now=timezone.now() + timedelta(minutes=11))

    assert counts == {"escalation_timeout": 1}
    done = wait_for(run)
    assert (done.status, done.last_error["code"]) == ("failed", "escalation_timeout")
    assert ticket_of(run).resolution == "escalation_timeout"
    assert_books_balanced(run)


# --------------------------------------------------------------------------- re-plan
def continuing(*agents: dict[str, Any], **run: Any) -> dict[str, Any]:
    return {"name": "replanning", "failure_mode": "continue", "agents": list(agents), **run}


def agent(name: str, *steps: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "tasks": [{"name": "t", "steps": list(steps)}]}


def test_the_rule_planner_reruns_failed_agents_with_wider_budgets(celery_worker: str) -> None:
    tenant = make_tenant()
    # Each fails its only attempt; the planner's copies have two, and the second succeeds.
    spec = continuing(
        agent("a", flaky("s", fails=1, max_attempts=1)),
        agent("b", flaky("s", fails=1, max_attempts=1)),
        agent("c", noop("s")),
    )
    run = submit(tenant, spec)

    done = wait_for(run)

    assert done.status == "completed"
    replan = Replan.objects.get(run=run)
    assert (replan.trigger, replan.planner, replan.status) == ("agents_failed", "rules", "spawned")
    assert sorted(replan.agents) == ["a-replan1", "b-replan1"]
    statuses = dict(run.agents.values_list("name", "status"))
    assert statuses == {
        "a": "skipped",
        "b": "skipped",
        "c": "completed",
        "a-replan1": "completed",
        "b-replan1": "completed",
    }
    assert_books_balanced(run)


def test_the_llm_planner_proposes_what_runs(celery_worker: str, llm_server: HttpServer) -> None:
    llm_server.reset()
    proposal = {"agents": [agent("fallback", noop("fetch"), noop("summarise"))]}
    llm_server.chat_completion(json.dumps(proposal), total_tokens=80)
    tenant = make_tenant()
    run = submit(
        tenant,
        continuing(
            agent("a", flaky("s", fails=5, code="invalid_input")), replan={"planner": "llm"}
        ),
    )

    done = wait_for(run)

    assert done.status == "completed"
    replan = Replan.objects.get(run=run)
    assert (replan.planner, replan.status, replan.agents) == ("llm", "spawned", ["fallback"])
    assert replan.usage["total_tokens"] == 80
    asked = json.loads(llm_server.requests[-1].json()["messages"][1]["content"])
    assert asked["failures"]["agents"][0]["code"] == "invalid_input"
    assert dict(run.agents.values_list("name", "status"))["fallback"] == "completed"
    assert_books_balanced(run)


def test_the_llm_planners_bad_answer_is_recorded_and_the_run_goes_on(
    celery_worker: str, llm_server: HttpServer
) -> None:
    llm_server.reset()
    llm_server.chat_completion("Let me think about that...")
    tenant = make_tenant()
    run = submit(
        tenant,
        continuing(
            agent("a", flaky("s", fails=5, code="invalid_input")), replan={"planner": "llm"}
        ),
    )

    done = wait_for(run)

    assert done.status == "completed"  # its one agent skipped under continue
    assert Replan.objects.get(run=run).error["code"] == "invalid_json"
    assert_books_balanced(run)


def test_a_re_plan_the_credits_do_not_cover_aborts_the_run(celery_worker: str) -> None:
    tenant = make_tenant(credits="1")
    spec = continuing(agent("a", flaky("s", fails=5, code="invalid_input")), credits="1")
    run = submit(tenant, spec)

    done = wait_for(run)

    assert (done.status, done.last_error["code"]) == ("failed", "insufficient_credits")
    assert Replan.objects.get(run=run).error["code"] == "insufficient_credits"
    assert_books_balanced(run)


# --------------------------------------------------------------------------- aborts
def started(run: Run, name: str) -> bool:
    step = steps_of(run).get(name)  # none before the run is picked up
    return step is not None and step.status == "running"


@pytest.mark.parametrize(
    ("spec", "code"),
    [
        (one_agent(flaky("bad", fails=5, code="invalid_input")), "invalid_input"),
        (one_agent(flaky("spent", fails=5, max_attempts=2)), "attempt_budget_exhausted"),
        (
            one_agent(
                noop("x"),
                flaky("bad", fails=5, code="invalid_input"),
                failure_mode="retry",
                credits="0.5",
            ),
            "insufficient_credits",
        ),
        (
            one_agent(
                {
                    "name": "long",
                    "tool": "sleep",
                    "params": {"seconds": 5},
                    "timeout": "300ms",
                    "retry": {"max_attempts": 1},
                }
            ),
            "attempt_budget_exhausted",
        ),
    ],
    ids=["non_retryable", "attempts_exhausted", "credits_for_the_next_attempt", "step_timeout"],
)
def test_each_abort_ends_failed_naming_its_condition_with_the_books_settled(
    celery_worker: str, spec: dict[str, Any], code: str
) -> None:
    # The organization holds just what one attempt reserves: a retry cannot be paid.
    tenant = make_tenant(credits="0.5" if code == "insufficient_credits" else 1000)

    done = wait_for(submit(tenant, spec))

    assert (done.status, done.last_error["code"]) == ("failed", code)
    assert done.attempt_number == 1
    assert_books_balanced(done)


def test_a_cancel_ends_cancelled_with_running_work_stopped(celery_worker: str) -> None:
    tenant = make_tenant()
    run = submit(tenant, one_agent({"name": "long", "tool": "sleep", "params": {"seconds": 30}}))
    wait_until(lambda: started(run, "long"), timeout=30, what="the step to start")

    assert tenant.post(f"/api/v1/runs/{run.pk}/cancel", {"reason": "enough"}).status_code == 200

    done = wait_for(run)
    assert (done.status, done.last_error) == (
        "cancelled",
        {"code": "cancelled", "message": "enough"},
    )
    assert steps_of(run)["long"].status == "cancelled"
    assert_books_balanced(run)


def test_a_run_past_its_timeout_fails_naming_it(celery_worker: str) -> None:
    tenant = make_tenant()
    run = submit(
        tenant,
        one_agent(
            {"name": "long", "tool": "sleep", "params": {"seconds": 30}}, timeouts={"run": "1h"}
        ),
    )
    wait_until(lambda: started(run, "long"), timeout=30, what="the step to start")

    sweeps.sweep_timeouts(now=timezone.now() + timedelta(hours=2))

    done = wait_for(run)
    assert (done.status, done.last_error["code"]) == ("failed", "run_timeout")
    assert_books_balanced(run)
