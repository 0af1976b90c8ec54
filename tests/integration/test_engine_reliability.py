"""Duplicates, crashes and approvals with a real worker process."""

from __future__ import annotations

import os
import signal

import pytest

from billing.models import LedgerEntry
from billing.pricing import tool_price
from config.celery import QUEUE_STEPS, QUEUE_SWEEPS, app
from orchestrator.transport import EXECUTE_STEP_TASK
from runs.models import HistoryEvent, Run, Step
from runs.people import approvals
from tests.factories import plan, step
from tests.integration.engine_support import assert_books_balanced, steps_of, submit, wait_for
from tests.support import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def running_step(run: Run, name: str) -> Step:
    return wait_until(
        lambda: Step.objects.filter(run=run, name=name, status="running").first(),
        timeout=30,
        what=f"step {name} to run",
    )


def test_the_same_step_message_delivered_twice_runs_and_charges_once(celery_worker: str) -> None:
    run = submit(
        plan(steps=1)
        | {
            "agents": [
                {
                    "name": "a",
                    "tasks": [
                        {"name": "t", "steps": [step("slow", "sleep", params={"seconds": 0.5})]}
                    ],
                }
            ]
        }
    )
    slow = running_step(run, "slow")
    for _ in range(3):  # duplicates while it runs
        app.send_task(EXECUTE_STEP_TASK, args=(slow.pk,), queue=QUEUE_STEPS)

    done = wait_for(run)
    for _ in range(2):  # and late ones, after it finished
        app.send_task(EXECUTE_STEP_TASK, args=(slow.pk,), queue=QUEUE_STEPS)
    echo = app.send_task("orchestrator.diagnostics.echo", args=("after",), queue=QUEUE_STEPS)
    echo.get(timeout=30)  # the queue has drained past the late duplicates

    assert done.status == "completed", done.last_error
    slow = Step.objects.get(pk=slow.pk)
    assert slow.attempts == 1
    claims = HistoryEvent.objects.filter(entity="step", entity_id=str(slow.pk), to_status="running")
    assert claims.count() == 1
    assert slow.cost == tool_price("sleep")  # its one attempt's price, charged once
    charges = LedgerEntry.objects.filter(run=run, type="charge")
    assert list(charges.values_list("amount", flat=True)) == [slow.cost]
    assert_books_balanced(run)


def test_a_worker_killed_mid_step_is_recovered_by_the_lease_sweep(celery_worker: str) -> None:
    run = submit(
        {
            "name": "crash",
            "agents": [
                {
                    "name": "a",
                    "tasks": [
                        {
                            "name": "t",
                            "steps": [
                                step("before"),
                                step("victim", "sleep", params={"seconds": 2}),
                                step("after"),
                            ],
                        }
                    ],
                }
            ],
        }
    )
    victim = running_step(run, "victim")
    pid = int(victim.worker.rsplit(":", 1)[1])

    os.kill(pid, signal.SIGKILL)

    def recovered() -> Run | None:
        # What beat does every ENGINE_SWEEP_INTERVAL: sweep expired leases.
        app.send_task("orchestrator.sweeps.leases", queue=QUEUE_SWEEPS)
        current = Run.objects.get(pk=run.pk)
        return current if current.status in ("completed", "failed") else None

    done = wait_until(recovered, timeout=90, what="the run to recover from the crash")
    assert done.status == "completed", done.last_error
    victim = Step.objects.get(pk=victim.pk)
    assert victim.status == "completed"
    assert victim.reclaims == 1
    assert victim.attempts == 2
    assert HistoryEvent.objects.filter(
        entity_id=str(victim.pk), message__contains="reclaimed"
    ).exists()
    assert_books_balanced(run)


def approval_plan() -> dict[str, object]:
    return {
        "name": "gated",
        "agents": [
            {
                "name": "a",
                "tasks": [
                    {
                        "name": "t",
                        "steps": [
                            step("draft", "echo", params={"text": "hi"}),
                            step("sign-off", "approval"),
                            step("publish"),
                        ],
                    }
                ],
            }
        ],
    }


def test_an_approval_step_waits_and_approve_lets_the_run_finish(celery_worker: str) -> None:
    run = submit(approval_plan())

    waiting = wait_for(run, ("waiting_approval",))
    first = approvals.run_approve(run_id=run.pk, comment="looks good", actor="admin:ops")
    again = approvals.run_approve(run_id=run.pk, comment="twice")
    done = wait_for(run)

    assert waiting.status == "waiting_approval"
    assert first.changed
    assert not again.changed
    assert done.status == "completed", done.last_error
    steps = steps_of(run)
    assert steps["sign-off"].output["approved"] is True
    assert steps["sign-off"].attempts == 0  # never executed by a worker
    assert steps["publish"].status == "completed"
    assert_books_balanced(run)


def test_reject_fails_the_run_with_approval_rejected(celery_worker: str) -> None:
    run = submit(approval_plan())
    wait_for(run, ("waiting_approval",))

    approvals.run_reject(run_id=run.pk, comment="not this one")
    done = wait_for(run)

    assert done.status == "failed"
    assert done.last_error["code"] == "approval_rejected"
    assert steps_of(run)["publish"].status == "cancelled"
    assert_books_balanced(run)


def test_a_running_step_renews_its_lease_and_the_runs_heartbeat(celery_worker: str) -> None:
    run = submit(task_plan_of([step("long", "sleep", params={"seconds": 3})]))
    long = running_step(run, "long")
    first_lease = long.lease_expires_at
    first_beat = Run.objects.get(pk=run.pk).last_heartbeat

    renewed = wait_until(
        lambda: Step.objects.filter(
            pk=long.pk, status="running", lease_expires_at__gt=first_lease
        ).first(),
        timeout=10,
        what="the lease to be renewed while the step runs",
    )

    assert renewed.lease_expires_at > first_lease
    assert Run.objects.get(pk=run.pk).last_heartbeat > first_beat
    assert wait_for(run).status == "completed"


def task_plan_of(steps: list[dict[str, object]]) -> dict[str, object]:
    return {"name": "beats", "agents": [{"name": "a", "tasks": [{"name": "t", "steps": steps}]}]}
