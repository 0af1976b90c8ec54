"""Two processes race conflicting transitions on the same runs, hundreds of times.

Each process has its own PostgreSQL connection; a barrier releases both at once for
every run, so they really contend for the row lock. The row lock and the transition
table must make the outcome deterministic: exactly one winner, exactly one event.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connections, transaction

from orchestrator.invariants import check_all
from runs import services
from runs.models import Run, RunEvent
from runs.states import InvalidTransition
from tests import factories

pytestmark = pytest.mark.django_db(transaction=True)

ROUNDS = 200


def _contender(
    operation: Callable[[str], Any],
    run_ids: list[str],
    barrier: Any,
    results: Any,
) -> None:
    outcomes = []
    try:
        for run_id in run_ids:
            barrier.wait()
            try:
                operation(run_id)
                outcomes.append("won")
            except InvalidTransition:
                outcomes.append("refused")
    finally:
        connections.close_all()
        results.put(outcomes)


def race(
    first: Callable[[str], Any], second: Callable[[str], Any], run_ids: list[str]
) -> tuple[list[str], list[str]]:
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(2, timeout=60)
    results: Any = context.Queue()
    # A forked child must not share the parent's socket to PostgreSQL.
    connections.close_all()
    processes = [
        context.Process(target=_contender, args=(op, run_ids, barrier, results))
        for op in (first, second)
    ]
    for process in processes:
        process.start()
    collected = [results.get(timeout=120) for _ in processes]
    for process in processes:
        process.join(30)
        assert process.exitcode == 0
    # Queue order is completion order, not process order: tell them apart by content.
    return collected[0], collected[1]


def _complete(run_id: str) -> None:
    # As the engine does: the last piece of work and the run finish in one transaction,
    # which takes the run's lock first (the lock order is run -> agent -> task -> step).
    with transaction.atomic():
        run = services.lock_run(run_id)
        factories.finish_all_work(run)
        services.run_complete(run_id=run_id)


def _fail(run_id: str) -> None:
    services.run_fail(run_id=run_id, code="tool_error", message="lost the race?")


def _start(run_id: str) -> None:
    services.run_start(run_id=run_id)


def _cancel(run_id: str) -> None:
    services.run_cancel(run_id=run_id, reason="race")


def running_runs(count: int) -> list[str]:
    organization = factories.org()
    ids = []
    for _ in range(count):
        run = factories.run(organization, steps=1)
        services.run_start(run_id=run.pk)
        services.run_pick_up(run_id=run.pk)
        ids.append(str(run.pk))
    return ids


def test_complete_racing_fail_has_exactly_one_winner_per_run() -> None:
    run_ids = running_runs(ROUNDS)

    a, b = race(_complete, _fail, run_ids)

    for index, run_id in enumerate(run_ids):
        assert sorted([a[index], b[index]]) == ["refused", "won"], run_id
        terminal_events = RunEvent.objects.filter(
            run_id=run_id, entity="run", to_status__in=["completed", "failed"]
        )
        assert terminal_events.count() == 1
        run = Run.objects.get(pk=run_id)
        assert run.status == terminal_events.get().to_status
    assert {name: found for name, found in check_all().items() if found} == {}


def test_cancel_racing_start_is_consistent_per_run() -> None:
    organization = factories.org()
    run_ids = [str(factories.run(organization, steps=1).pk) for _ in range(ROUNDS)]

    starts, cancels = race(_start, _cancel, run_ids)
    if "won" not in cancels and "refused" not in starts:
        starts, cancels = cancels, starts  # the queue returned them the other way round

    for run_id in run_ids:
        run = Run.objects.get(pk=run_id)
        transitions = list(
            RunEvent.objects.filter(run_id=run_id, entity="run", kind="transition")
            .order_by("id")
            .values_list("from_status", "to_status")
        )
        assert run.status == "cancelled"  # cancel always lands; start may or may not
        # Either cancel came first (start refused), or start then cancel, never more.
        assert transitions in (
            [("created", "cancelled")],
            [("created", "pending"), ("pending", "cancelled")],
        )
        assert (run.attempt_number == 1) == (len(transitions) == 2)
    assert {name: found for name, found in check_all().items() if found} == {}
