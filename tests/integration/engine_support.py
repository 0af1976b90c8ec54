"""Helpers for engine tests: submit a plan, wait for the run to settle, check the books."""

from __future__ import annotations

from typing import Any

from billing.models import LedgerEntry, Organization
from common.invariants import violations
from runs import services
from runs.engine.start import run_start
from runs.models import Run, RunAttempt, Step
from runs.states import RUN_TERMINAL
from tests import factories
from tests.support import wait_until


def submit(
    spec: dict[str, Any], credits: int = 1000, organization: Organization | None = None
) -> Run:
    """Create and start a run of ``spec`` (in a new organization with ``credits``, unless
    one is given)."""
    organization = organization or factories.org(credits=credits)
    run = services.run_create(organization=organization, plan=spec)
    return run_start(run_id=run.pk)


def wait_for(run: Run, statuses: tuple[str, ...] = tuple(RUN_TERMINAL), timeout: float = 60) -> Run:
    def settled() -> Run | None:
        current = Run.objects.get(pk=run.pk)
        return current if current.status in statuses else None

    return wait_until(settled, timeout=timeout, what=f"run {run.pk} to reach {statuses}")


def steps_of(run: Run) -> dict[str, Step]:
    return {
        step.name: step
        for step in Step.objects.filter(
            run=run, attempt_number=Run.objects.get(pk=run.pk).attempt_number
        )
    }


def assert_books_balanced(run: Run, check_invariants: bool = True) -> None:
    for attempt in RunAttempt.objects.filter(run=run):
        reservation = attempt.reservation
        assert reservation.settled_at is not None, attempt
        assert reservation.charged + reservation.refunded == reservation.reserved
        # What its steps were charged reaches the ledger as one entry when it settles.
        charges = LedgerEntry.objects.filter(attempt=attempt, type="charge")
        entered = list(charges.values_list("amount", flat=True))
        assert entered == ([reservation.charged] if reservation.charged else []), attempt
    if not check_invariants:
        return
    broken = violations()
    assert broken == {}, broken
