"""Organization limits, concurrency keys and fair dispatch with a real worker, Redis and
PostgreSQL (docs/fairness.md).

Runs are held running by an approval step (a run waiting for an approval holds its
place), so what waits, and in what order it starts, is decided by the rows alone."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from runs.admission import run_admission
from runs.models import EventKind, Run, Step
from runs.people import approvals
from runs.selectors import run_history
from tests import factories
from tests.integration.engine_support import assert_books_balanced, submit, wait_for
from tests.support import wait_until
from tests.tenants import make_tenant

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

GATED = ("waiting_approval",)


def gated(name: str = "gated", *, priority: int = 5, **extra: Any) -> dict[str, Any]:
    """A run held at an approval, then one no-op step."""
    return {
        "name": name,
        "priority": priority,
        "agents": [
            {
                "name": "a",
                "tasks": [
                    {
                        "name": "t",
                        "steps": [
                            {"name": "gate", "tool": "approval"},
                            {"name": "after", "tool": "noop"},
                        ],
                    }
                ],
            }
        ],
        **extra,
    }


def keyed(customer: str, *, priority: int = 5) -> dict[str, Any]:
    return gated(
        f"for-{customer}",
        priority=priority,
        variables={"customer": customer},
        concurrency={"key": "customer-${variables.customer}", "max_runs": 1},
    )


def queued(run: Run) -> str:
    """Wait until ``run`` was looked at and left waiting; its reason."""
    current = wait_until(
        lambda: Run.objects.filter(pk=run.pk, status="pending").exclude(queued_reason="").first(),
        timeout=30,
        what=f"run {run.name} to be queued",
    )
    return current.queued_reason


def approve(run: Run) -> Run:
    approvals.run_approve(run_id=run.pk, actor="test")
    return wait_for(run)


def still_waiting(*runs: Run) -> bool:
    return all(Run.objects.get(pk=run.pk).status == "pending" for run in runs)


def test_runs_beyond_the_limit_wait_and_start_by_priority_then_fifo(celery_worker: str) -> None:
    organization = factories.org()
    run_admission.limits_set(organization.pk, actor="test", max_running_runs=2)
    first = submit(gated("first"), organization=organization)
    second = submit(gated("second"), organization=organization)
    wait_for(first, GATED)
    wait_for(second, GATED)
    older = submit(gated("older"), organization=organization)
    newer = submit(gated("newer"), organization=organization)
    urgent = submit(gated("urgent", priority=1), organization=organization)
    for run in (older, newer, urgent):
        assert "max_running_runs 2" in queued(run)

    assert approve(first).status == "completed"
    wait_for(urgent, GATED)  # priority first
    assert still_waiting(older, newer)

    assert approve(second).status == "completed"
    wait_for(older, GATED)  # then FIFO
    assert still_waiting(newer)

    assert approve(urgent).status == "completed"
    wait_for(newer, GATED)
    for run in (older, newer):
        assert approve(run).status == "completed"
        assert_books_balanced(run, check_invariants=False)
    messages = list(
        run_history(newer)
        .filter(kind=EventKind.QUEUE)
        .order_by("id")
        .values_list("message", flat=True)
    )
    assert messages[0].startswith("waiting to start: the organization has 2 runs running")
    assert messages[-1] == "admitted"
    assert_books_balanced(first)


def test_a_limit_raised_in_the_admin_applies_without_a_restart(celery_worker: str) -> None:
    organization = factories.org()
    run_admission.limits_set(organization.pk, actor="test", max_running_runs=1)
    first = submit(gated("first"), organization=organization)
    wait_for(first, GATED)
    second = submit(gated("second"), organization=organization)
    queued(second)

    run_admission.limits_set(organization.pk, actor="admin:ops", max_running_runs=2)

    wait_for(second, GATED)
    for run in (first, second):
        assert approve(run).status == "completed"


def test_pending_runs_beyond_their_limit_are_refused_until_one_starts(
    celery_worker: str,
) -> None:
    tenant = make_tenant()
    organization = tenant.organization
    run_admission.limits_set(organization.pk, actor="test", max_running_runs=1, max_pending_runs=2)
    first = submit(gated("first"), organization=organization)
    wait_for(first, GATED)
    waiting = [submit(gated(f"waiting-{i}"), organization=organization) for i in range(2)]
    for run in waiting:
        queued(run)

    refused = tenant.post("/api/v1/runs", {"plan": gated("one-too-many"), "start": True})
    assert refused.status_code == 429
    assert refused.json()["code"] == "too_many_pending_runs"
    assert not Run.objects.filter(organization=organization, name="one-too-many").exists()

    assert approve(first).status == "completed"
    wait_for(waiting[0], GATED)
    accepted = tenant.post("/api/v1/runs", {"plan": gated("now-it-fits"), "start": True})
    assert accepted.status_code == 201, accepted.json()
    for run in waiting:
        # waiting[1] starts only once waiting[0] has ended: approving it before it reached
        # its gate would approve nothing (a no-op) and leave it there.
        assert approve(wait_for(run, GATED)).status == "completed"
    last = Run.objects.get(pk=accepted.json()["id"])
    assert approve(wait_for(last, GATED)).status == "completed"


def test_a_concurrency_key_runs_one_per_customer_in_order(celery_worker: str) -> None:
    organization = factories.org()
    a_first = submit(keyed("a"), organization=organization)
    b_first = submit(keyed("b"), organization=organization)
    wait_for(a_first, GATED)
    wait_for(b_first, GATED)  # another customer is not held back
    a_later = submit(keyed("a"), organization=organization)
    a_urgent = submit(keyed("a", priority=1), organization=organization)
    assert queued(a_later) == "concurrency key 'customer-a' has 1 runs running, its limit (1)"
    queued(a_urgent)

    assert approve(a_first).status == "completed"
    wait_for(a_urgent, GATED)
    assert still_waiting(a_later)
    assert approve(a_urgent).status == "completed"
    wait_for(a_later, GATED)
    for run in (a_later, b_first):
        assert approve(run).status == "completed"
    assert Run.objects.get(pk=a_later.pk).concurrency_key == "customer-a"


def test_steps_beyond_the_limit_never_execute_at_once(celery_worker: str) -> None:
    organization = factories.org()
    run_admission.limits_set(organization.pk, actor="test", max_running_steps=1)
    sleepers = [{"name": f"s{i}", "tool": "sleep", "params": {"seconds": 0.1}} for i in range(6)]
    spec = {
        "name": "one-at-a-time",
        "agents": [
            {
                "name": "a",
                "tasks": [
                    {"name": "t", "mode": "parallel", "max_concurrent_steps": 6, "steps": sleepers}
                ],
            }
        ],
    }

    run = wait_for(submit(spec, organization=organization))

    assert run.status == "completed"
    spans = sorted(Step.objects.filter(run=run).values_list("started_at", "completed_at"))
    for (_, previous_end), (start, _) in itertools.pairwise(spans):
        assert start >= previous_end, spans
    assert_books_balanced(run)


def test_three_organizations_busy_at_once_are_all_served(celery_worker: str) -> None:
    """A wide fan-out of one organization does not starve two small runs of others, nor
    its own urgent run: each is served within slices, not after the fan-out."""
    big, small_b, small_c = (factories.org(credits=100_000) for _ in range(3))
    wide = {
        "name": "wide",
        "agents": [
            {
                "name": "a",
                "tasks": [
                    {
                        "name": "t",
                        "mode": "parallel",
                        "max_concurrent_steps": 400,
                        "steps": [
                            {"name": f"s{i}", "tool": "sleep", "params": {"seconds": 0.01}}
                            for i in range(400)
                        ],
                    }
                ],
            }
        ],
    }
    fan_out = submit(wide, organization=big)
    wait_until(
        lambda: Step.objects.filter(run=fan_out, status="completed").count() >= 10,
        timeout=60,
        what="the fan-out to be under way",
    )
    small = factories.plan(steps=5)
    b = submit(small, organization=small_b)
    c = submit(small, organization=small_c)
    urgent = submit(factories.plan(steps=5, priority=1), organization=big)

    for run in (b, c, urgent):
        assert wait_for(run, timeout=120).status == "completed"
        assert Run.objects.get(pk=fan_out.pk).status == "running", run.name
    assert wait_for(fan_out, timeout=300).status == "completed"
    assert_books_balanced(fan_out)


def test_child_runs_are_their_parents_work_and_never_wait_for_a_place(
    celery_worker: str,
) -> None:
    """With one place and one pending run allowed, a parent whose sync child run (with a
    concurrency key the parent also holds) needed a place of its own would wait for it
    forever: children hold none and are never queued."""
    organization = factories.org()
    run_admission.limits_set(organization.pk, actor="test", max_running_runs=1, max_pending_runs=1)
    child_plan = {
        "name": "child",
        "concurrency": {"key": "same"},
        "agents": [
            {"name": "a", "tasks": [{"name": "t", "steps": [{"name": "s", "tool": "noop"}]}]}
        ],
    }
    parent_plan = {
        "name": "parent",
        "concurrency": {"key": "same"},
        "agents": [
            {
                "name": "a",
                "tasks": [
                    {
                        "name": "t",
                        "steps": [
                            {
                                "name": "child",
                                "tool": "run",
                                "params": {"plan": child_plan, "execution_mode": "sync"},
                            }
                        ],
                    }
                ],
            }
        ],
    }

    parent = wait_for(submit(parent_plan, organization=organization))

    assert parent.status == "completed"
    child = Run.objects.get(parent_run=parent)
    assert child.status == "completed"
    assert child.queued_reason == ""
    assert not run_history(child).filter(kind=EventKind.QUEUE).exists()
