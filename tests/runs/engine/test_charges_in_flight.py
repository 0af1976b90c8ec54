"""A database with runs in flight upgrades in place to charges counted per attempt.

Before billing.0016 every step attempt's charge was a ledger entry of its own (keyed
`charge:<step>:<step attempt>`) besides its draw on the reservation; since, it is the
draw alone, and the attempt's settlement enters what it charged as one entry. An
attempt opened before the upgrade and settled after it has entries for some of its
steps already: its settlement enters only what they leave unentered, so the ledger's
charges of every attempt still add up to what its reservation charged, once.

The run's first steps are served by today's engine (whose code needs the step's columns
of runs.0029, later than the schema of then); the schema is then taken back to
billing.0015, where those steps' entries are written as the engine wrote them then, and
brought up to date again, as an upgrade finds them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from decimal import Decimal

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from billing.models import LedgerEntry, Reservation
from common import database_code
from common.invariants import violations
from runs.engine.outcomes import Outcome
from runs.models import RunAttempt, Step
from tests.runs.engine.harness import EngineRun

pytestmark = pytest.mark.django_db(transaction=True)

BEFORE = [("billing", "0015_quota_parked_waits")]
PLAN = {
    "name": "in-flight",
    "credits": "1",
    "agents": [
        {
            "name": "a",
            "tasks": [{"name": "t", "steps": [{"name": n, "tool": "noop"} for n in "xyz"]}],
        }
    ],
}


def latest(executor: MigrationExecutor) -> None:
    """The latest schema, and its code installed after it, as `migrate` does."""
    executor.loader.build_graph()
    executor.migrate(executor.loader.graph.leaf_nodes())
    database_code.install(connection)


@pytest.fixture
def executor() -> Iterator[MigrationExecutor]:
    executor = MigrationExecutor(connection)
    yield executor
    latest(executor)


def charged_before_the_upgrade(executor: MigrationExecutor, *steps: Step) -> list[LedgerEntry]:
    """The entries the engine's recording wrote of these step attempts' charges before the
    upgrade, beside their draws on the reservation (which it still makes), written at the
    schema of then; the schema then brought up to date."""
    executor.migrate(BEFORE)
    entries = []
    for step in steps:
        attempt = RunAttempt.objects.get(run_id=step.run_id, attempt_number=step.attempt_number)
        entries.append(
            LedgerEntry.objects.create(
                organization_id=attempt.run.organization_id,
                run_id=step.run_id,
                attempt=attempt,
                step=step,
                type="charge",
                amount=step.cost,
                idempotency_key=f"charge:{step.pk}:{step.attempts}",
                reason=f"step {step.name} attempt {step.attempts}",
                actor="engine",
            )
        )
    latest(executor)
    return entries


def test_an_attempt_charged_per_step_before_the_upgrade_settles_what_is_left_once(
    executor: MigrationExecutor, engine_run: Callable[..., EngineRun]
) -> None:
    run = engine_run(PLAN)
    x = run.finish("x", Outcome(output={}, cost=Decimal("0.01")))
    [old] = charged_before_the_upgrade(executor, x)

    # Open across the upgrade: its step's entry is no more than it charged.
    assert violations() == {}
    run.finish("y", Outcome(output={}, cost=Decimal("0.02")))
    run.finish("z", Outcome(output={}, cost=Decimal("0.03")))

    assert run.refresh().status == "completed"
    attempt = RunAttempt.objects.get(run=run.run)
    charges = LedgerEntry.objects.filter(run=run.run, type="charge").order_by("created_at")
    assert [(e.id, e.step_id, e.amount, e.idempotency_key) for e in charges] == [
        (old.id, x.pk, Decimal("0.01"), f"charge:{x.pk}:1"),
        (charges[1].id, None, Decimal("0.05"), f"charge:{attempt.pk}"),
    ]
    reservation = Reservation.objects.get(run_id=run.run.pk)
    refund = LedgerEntry.objects.get(run=run.run, type="refund")
    assert (reservation.charged, reservation.refunded) == (Decimal("0.06"), refund.amount)
    assert sum(e.amount for e in charges) + refund.amount == Decimal(1)
    assert violations() == {}


def test_an_attempt_whose_every_charge_was_entered_before_the_upgrade_adds_no_charge(
    executor: MigrationExecutor, engine_run: Callable[..., EngineRun]
) -> None:
    run = engine_run(PLAN)
    served = [run.finish(name, Outcome(output={}, cost=Decimal("0.01"))) for name in "xy"]
    charged_before_the_upgrade(executor, *served)
    run.finish("z")  # costs nothing

    charges = LedgerEntry.objects.filter(run=run.run, type="charge")
    assert sorted(charges.values_list("amount", flat=True)) == [Decimal("0.01")] * 2
    assert not charges.filter(step__isnull=True).exists()
    assert Reservation.objects.get(run_id=run.run.pk).charged == Decimal("0.02")
    assert violations() == {}
