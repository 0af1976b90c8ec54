"""Random sequences of run operations never break an invariant (hypothesis, stateful).

Operations are applied through the real services, and steps claimed and recorded as a
worker's are among them (the links of the rows they write are checked by no foreign
key: ``runs.orphans`` and ``billing.orphans`` must find none); ones the state machine
refuses must leave the run exactly as it was. After every step, every invariant of runs and their
books holds; the artifacts' (which no operation here touches) at each example's end.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from django.db import transaction
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    invariant,
    rule,
    run_state_machine_as_test,
)

from common.invariants import violations
from common.tools.base import ToolError
from runs import services
from runs.engine import control
from runs.engine.outcomes import Outcome, record
from runs.engine.start import run_start
from runs.models import Run, Step
from runs.people import approvals
from runs.selectors import run_history
from runs.states import InvalidTransition
from runs.transitions import claim_next_step, transition
from tests import factories

REFUSALS = (InvalidTransition, services.AttemptsExhausted, services.RunDeleted)


class RunOperations(RuleBasedStateMachine):
    runs = Bundle("runs")

    def __init__(self) -> None:
        super().__init__()
        # Each example runs in a savepoint rolled back at teardown: examples stay independent.
        self._atomic = transaction.atomic()
        self._atomic.__enter__()
        self.organization = factories.org()

    def teardown(self) -> None:
        try:
            assert violations() == {}
        finally:
            transaction.set_rollback(True)
            self._atomic.__exit__(None, None, None)

    def _apply(self, run: Run, operation: Any) -> None:
        before = Run.objects.get(pk=run.pk)
        events_before = run_history(run).count()
        try:
            with transaction.atomic():
                operation()
        except REFUSALS:
            after = Run.objects.get(pk=run.pk)
            assert (after.status, after.attempt_number) == (before.status, before.attempt_number)
            assert run_history(run).count() == events_before

    @rule(
        target=runs,
        agents=st.integers(1, 3),
        steps=st.integers(1, 3),
        max_attempts=st.integers(1, 3),
    )
    def create(self, agents: int, steps: int, max_attempts: int) -> Run:
        return factories.run(
            self.organization, agents=agents, steps=steps, max_attempts=max_attempts
        )

    @rule(target=runs, steps=st.integers(1, 3), max_attempts=st.integers(1, 3))
    def create_running(self, steps: int, max_attempts: int) -> Run:
        """A run started and picked up, its first steps dispatched: a worker's to claim."""
        run = factories.run(self.organization, agents=1, steps=steps, max_attempts=max_attempts)
        run_start(run_id=run.pk)
        assert control.pick_up(run.pk)
        return run

    @rule(run=runs)
    def start(self, run: Run) -> None:
        self._apply(run, lambda: run_start(run_id=run.pk))

    @rule(run=runs)
    def pick_up(self, run: Run) -> None:
        self._apply(run, lambda: services.run_pick_up(run_id=run.pk))

    @rule(run=runs, failed=st.booleans())
    def work(self, run: Run, failed: bool) -> None:
        """A worker serves the run: picks it up when it waits for that (its attempt
        materialised, its ready steps dispatched), claims its next step and records the
        outcome: the hot path's function, or the general path where it declines."""

        def operation() -> None:
            if Run.objects.get(pk=run.pk).status in ("pending", "retrying"):
                control.pick_up(run.pk)
            claimed = claim_next_step(run.pk, worker="w", task_id="t", lease_seconds=600)
            if claimed is None:
                raise InvalidTransition("step", "pending", "running", "nothing claimable")
            error = ToolError("tool_error", "random", retryable=False) if failed else None
            outcome = Outcome(output={}, cost=Decimal("0.01"), error=error)
            record(claimed["id"], run.pk, claimed["attempts"], outcome)

        self._apply(run, operation)

    @rule(run=runs, reason=st.text(max_size=20))
    def cancel(self, run: Run, reason: str) -> None:
        self._apply(run, lambda: services.run_cancel(run_id=run.pk, reason=reason))

    @rule(run=runs)
    def pause(self, run: Run) -> None:
        self._apply(run, lambda: services.run_pause(run_id=run.pk))

    @rule(run=runs)
    def resume(self, run: Run) -> None:
        self._apply(run, lambda: services.run_resume(run_id=run.pk))

    @rule(run=runs)
    def resumed(self, run: Run) -> None:
        self._apply(run, lambda: services.run_resumed(run_id=run.pk))

    @rule(run=runs)
    def fail(self, run: Run) -> None:
        self._apply(
            run, lambda: services.run_fail(run_id=run.pk, code="tool_error", message="random")
        )

    @rule(run=runs)
    def retry(self, run: Run) -> None:
        self._apply(run, lambda: services.run_retry(run_id=run.pk))

    @rule(run=runs)
    def requeue(self, run: Run) -> None:
        self._apply(run, lambda: services.run_requeue(run_id=run.pk))

    @rule(run=runs)
    def delete(self, run: Run) -> None:
        self._apply(run, lambda: services.run_delete(run_id=run.pk))

    @rule(run=runs)
    def finish_and_complete(self, run: Run) -> None:
        def operation() -> None:
            locked = services.lock_run(run.pk)
            if locked.status != "running":
                raise InvalidTransition("run", locked.status, "completed")
            factories.finish_all_work(locked)
            services.run_complete(run_id=run.pk)

        self._apply(run, operation)

    @rule(run=runs)
    def wait_for_approval(self, run: Run) -> None:
        def operation() -> None:
            locked = services.lock_run(run.pk)
            step = (
                Step.objects.filter(
                    run=locked, attempt_number=locked.attempt_number, status="pending"
                )
                .order_by("pk")
                .first()
            )
            if locked.status != "running" or step is None:
                raise InvalidTransition("run", locked.status, "waiting_approval")
            transition(Step, step.pk, "waiting_approval")
            transition(Run, locked.pk, "waiting_approval")

        self._apply(run, operation)

    @rule(run=runs, approve=st.booleans())
    def decide(self, run: Run, approve: bool) -> None:
        service = approvals.run_approve if approve else approvals.run_reject
        self._apply(run, lambda: service(run_id=run.pk, comment="random"))

    @invariant()
    def invariants_hold(self) -> None:
        assert violations("billing.", "hierarchy.", "runs.", "steps.") == {}


@pytest.mark.django_db
def test_random_operation_sequences_keep_every_invariant() -> None:
    run_state_machine_as_test(
        RunOperations,
        settings=settings(
            max_examples=15,
            stateful_step_count=25,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
