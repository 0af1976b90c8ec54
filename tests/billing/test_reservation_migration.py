"""billing.0007 moves each attempt's credits from runs' attempt row to billing's own
Reservation row, before runs.0007 drops the old columns: nothing is lost on the way."""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

from common import database_code

pytestmark = pytest.mark.django_db(transaction=True)

BEFORE = [("billing", "0006_secret"), ("runs", "0006_run_redispatched_at")]
AFTER = [("billing", "0007_reservation"), ("runs", "0007_attempt_credits_to_billing")]


@pytest.fixture
def at_the_old_schema() -> Iterator[MigrationExecutor]:
    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE)
    executor.loader.build_graph()
    yield executor
    executor.loader.build_graph()
    executor.migrate(executor.loader.graph.leaf_nodes())  # the latest schema again
    database_code.install(connection)  # and its code, as `migrate` installs it after them


def test_every_attempts_credits_are_copied_to_its_reservation(
    at_the_old_schema: MigrationExecutor,
) -> None:
    old = at_the_old_schema.loader.project_state(BEFORE).apps
    organization = old.get_model("billing", "Organization").objects.create(name="Acme")
    run = old.get_model("runs", "Run").objects.create(
        organization=organization, name="r", spec={}, attempt_number=2, max_attempts=3
    )
    attempt_model = old.get_model("runs", "RunAttempt")
    settled = timezone.now()
    first = attempt_model.objects.create(
        run=run,
        attempt_number=1,
        credits_reserved=Decimal(10),
        credits_charged=Decimal(3),
        credits_refunded=Decimal(7),
        settled_at=settled,
    )
    second = attempt_model.objects.create(
        run=run, attempt_number=2, credits_reserved=Decimal(5), credits_charged=Decimal("1.5")
    )

    at_the_old_schema.loader.build_graph()
    at_the_old_schema.migrate(AFTER)

    new = at_the_old_schema.loader.project_state(AFTER).apps
    rows = {
        r.attempt_id: r
        for r in new.get_model("billing", "Reservation").objects.filter(run_id=run.pk)
    }
    assert set(rows) == {first.pk, second.pk}
    one, two = rows[first.pk], rows[second.pk]
    assert (one.organization_id, one.attempt_number) == (organization.pk, 1)
    assert (one.reserved, one.charged, one.refunded, one.settled_at) == (
        Decimal(10),
        Decimal(3),
        Decimal(7),
        settled,
    )
    assert (two.reserved, two.charged, two.refunded, two.settled_at) == (
        Decimal(5),
        Decimal("1.5"),
        Decimal(0),
        None,
    )
