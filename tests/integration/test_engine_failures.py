"""Retries, budgets, failure modes at every level, and on_error handlers, on a real worker."""

from __future__ import annotations

from typing import Any

import pytest

from runs.models import Agent, HistoryEvent, RunAttempt, Step, Task
from runs.selectors import run_history
from tests.factories import step
from tests.integration.engine_support import assert_books_balanced, steps_of, submit, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def one_task(*steps: dict[str, Any], **task: Any) -> dict[str, Any]:
    return {
        "name": "run",
        "agents": [{"name": "a", "tasks": [{"name": "t", "steps": list(steps), **task}]}],
    }


def failing(name: str, code: str = "transient", **extra: Any) -> dict[str, Any]:
    return step(name, "fail", params={"code": code, **extra.pop("params", {})}, **extra)


def test_a_retryable_failure_is_retried_with_backoff_until_it_succeeds(celery_worker: str) -> None:
    policy = {"max_attempts": 4, "backoff": "fixed", "base_delay_ms": 300, "jitter": 0}
    run = submit(one_task(failing("flaky", params={"until_attempt": 2}, retry=policy)))

    done = wait_for(run)

    assert done.status == "completed", done.last_error
    flaky = steps_of(run)["flaky"]
    assert (flaky.attempts, flaky.failures) == (3, 2)
    retries = list(
        HistoryEvent.objects.filter(entity="step", entity_id=str(flaky.pk), to_status="pending")
        .order_by("id")
        .values_list("payload", "created_at")
    )
    claims = list(
        HistoryEvent.objects.filter(entity="step", entity_id=str(flaky.pk), to_status="running")
        .order_by("id")
        .values_list("created_at", flat=True)
    )
    assert [payload["delay_ms"] for payload, _ in retries] == [300, 300]
    for (_, failed_at), next_claim in zip(retries, claims[1:], strict=True):
        assert (next_claim - failed_at).total_seconds() >= 0.29  # the backoff was waited
    assert_books_balanced(run)


def test_a_non_retryable_error_fails_at_once(celery_worker: str) -> None:
    run = submit(one_task(failing("bad", code="invalid_input", retry={"max_attempts": 5})))

    done = wait_for(run)

    assert done.status == "failed"
    assert done.last_error["code"] == "invalid_input"
    assert steps_of(run)["bad"].attempts == 1
    assert_books_balanced(run)


@pytest.mark.parametrize(
    ("policy", "code", "attempts"),
    [
        ({"max_attempts": 3, "base_delay_ms": 10}, "attempt_budget_exhausted", 3),
        (
            {"max_attempts": 5, "max_failures": 2, "base_delay_ms": 10},
            "failure_budget_exhausted",
            2,
        ),
    ],
)
def test_exhausted_budgets_fail_with_their_reason_code(
    celery_worker: str, policy: dict[str, Any], code: str, attempts: int
) -> None:
    run = submit(one_task(failing("always", retry=policy)))

    done = wait_for(run)

    assert done.status == "failed"
    always = steps_of(run)["always"]
    assert always.error["code"] == code
    assert always.error["cause"] == "transient"
    assert always.attempts == attempts
    assert done.last_error["code"] == code
    assert_books_balanced(run)


def test_retry_on_narrows_what_is_retried(celery_worker: str) -> None:
    policy = {"max_attempts": 5, "retry_on": ["timeout"], "base_delay_ms": 10}
    run = submit(one_task(failing("limited", code="rate_limited", retry=policy)))

    done = wait_for(run)

    assert steps_of(run)["limited"].attempts == 1
    assert done.last_error["code"] == "rate_limited"


def test_task_continue_skips_the_failed_step_and_carries_on(celery_worker: str) -> None:
    run = submit(
        one_task(failing("broken", code="not_found"), step("after"), failure_mode="continue")
    )

    done = wait_for(run)

    assert done.status == "completed", done.last_error
    steps = steps_of(run)
    assert steps["broken"].status == "skipped"
    assert steps["broken"].error["code"] == "not_found"
    assert steps["after"].status == "completed"
    assert Task.objects.get(run=run).status == "completed"
    assert_books_balanced(run)


def test_fail_fast_propagates_from_step_to_run_and_cancels_the_rest(celery_worker: str) -> None:
    spec = {
        "name": "ff",
        "agents": [
            {
                "name": "a",
                "tasks": [
                    {"name": "t1", "steps": [failing("boom", code="auth_error"), step("never")]},
                    {"name": "t2", "steps": [step("later")]},
                ],
            }
        ],
    }
    run = submit(spec)

    done = wait_for(run)

    assert done.status == "failed"
    assert done.last_error["code"] == "auth_error"
    steps = steps_of(run)
    assert steps["boom"].status == "failed"
    assert {steps["never"].status, steps["later"].status} == {"cancelled"}
    assert set(Task.objects.filter(run=run).values_list("status", flat=True)) == {
        "failed",
        "cancelled",
    }
    assert Agent.objects.get(run=run).status == "failed"
    assert_books_balanced(run)


def test_task_retry_runs_the_task_again_at_most_three_times(celery_worker: str) -> None:
    run = submit(one_task(step("ok"), failing("boom", code="tool_error"), failure_mode="retry"))

    done = wait_for(run)

    assert done.status == "failed"
    task = Task.objects.get(run=run)
    assert task.retry_count == 3
    assert task.status == "failed"
    generations = sorted(set(Step.objects.filter(task=task).values_list("generation", flat=True)))
    assert generations == [0, 1, 2, 3]
    assert Step.objects.filter(task=task, name="ok", status="completed").count() == 4
    assert run_history(run).filter(kind="retry", entity="task").count() == 3
    assert_books_balanced(run)


def test_agent_continue_skips_a_failed_task_and_the_run_completes(celery_worker: str) -> None:
    spec = {
        "name": "agent-continue",
        "agents": [
            {
                "name": "a",
                "failure_mode": "continue",
                "tasks": [
                    {"name": "bad", "steps": [failing("boom", code="not_found")]},
                    {"name": "good", "steps": [step("fine")]},
                ],
            }
        ],
    }
    run = submit(spec)

    done = wait_for(run)

    assert done.status == "completed", done.last_error
    tasks = dict(Task.objects.filter(run=run).values_list("name", "status"))
    assert tasks == {"bad": "skipped", "good": "completed"}
    assert_books_balanced(run)


def test_agent_retry_reruns_its_tasks_as_a_new_generation(celery_worker: str) -> None:
    spec = {
        "name": "agent-retry",
        "agents": [
            {
                "name": "a",
                "failure_mode": "retry",
                "tasks": [{"name": "t", "steps": [failing("boom", code="not_found")]}],
            }
        ],
    }
    run = submit(spec)

    done = wait_for(run)

    assert done.status == "failed"
    agent = Agent.objects.get(run=run)
    assert agent.retry_count == 3
    assert sorted(Task.objects.filter(agent=agent).values_list("generation", flat=True)) == [
        0,
        1,
        2,
        3,
    ]
    assert agent.task_count == 4
    assert_books_balanced(run)


def test_run_continue_skips_a_failed_agent(celery_worker: str) -> None:
    spec = {
        "name": "run-continue",
        "failure_mode": "continue",
        "agents": [
            {"name": "bad", "tasks": [{"name": "t", "steps": [failing("boom", code="not_found")]}]},
            {"name": "good", "tasks": [{"name": "t", "steps": [step("fine")]}]},
        ],
    }
    run = submit(spec)

    done = wait_for(run)

    assert done.status == "completed", done.last_error
    assert dict(Agent.objects.filter(run=run).values_list("name", "status")) == {
        "bad": "skipped",
        "good": "completed",
    }
    assert_books_balanced(run)


def test_run_retry_starts_a_new_attempt_with_its_own_reservation(celery_worker: str) -> None:
    spec = one_task(failing("boom", code="not_found")) | {
        "failure_mode": "retry",
        "max_attempts": 2,
        "credits": 5,
    }
    run = submit(spec)

    def retried_and_failed() -> bool:
        done = wait_for(run)
        return done.attempt_number == 2

    from tests.support import wait_until

    wait_until(retried_and_failed, timeout=60, what="the automatic run retry")
    done = wait_for(run)
    assert done.status == "failed"
    attempts = list(RunAttempt.objects.filter(run=run).order_by("attempt_number"))
    assert [a.reservation.reserved for a in attempts] == [5, 5]
    assert [a.outcome for a in attempts] == ["failed", "failed"]
    assert Step.objects.filter(run=run).count() == 2  # one per attempt, both kept
    assert_books_balanced(run)


def test_on_error_handler_success_handles_the_failure(celery_worker: str) -> None:
    handler = step("notify", "echo", params={"failed": "${error.step}", "code": "${error.code}"})
    run = submit(one_task(failing("boom", code="not_found", on_error=[handler]), step("after")))

    done = wait_for(run)

    assert done.status == "completed", done.last_error
    steps = steps_of(run)
    assert steps["boom"].status == "failed"
    assert steps["boom"].handled is True
    assert steps["boom.on_error.notify"].output == {"failed": "boom", "code": "not_found"}
    assert steps["after"].status == "completed"
    assert_books_balanced(run)


def test_on_error_handler_failure_propagates_the_original_failure(celery_worker: str) -> None:
    handler = failing("notify", code="invalid_input")
    run = submit(one_task(failing("boom", code="not_found", on_error=[handler]), step("after")))

    done = wait_for(run)

    assert done.status == "failed"
    assert done.last_error["code"] == "not_found"
    steps = steps_of(run)
    assert steps["boom.on_error.notify"].status == "failed"
    assert steps["after"].status == "cancelled"
    assert_books_balanced(run)


def test_a_step_past_its_timeout_is_interrupted_and_fails_with_timeout(celery_worker: str) -> None:
    slow = step("slow", "sleep", params={"seconds": 30}, timeout="1s", retry={"max_attempts": 1})
    run = submit(one_task(slow))

    done = wait_for(run, timeout=30)

    assert done.status == "failed"
    error = steps_of(run)["slow"].error
    assert (error["code"], error["cause"]) == ("attempt_budget_exhausted", "timeout")
    assert "timed out after 1s" in error["message"]
    assert_books_balanced(run)
