"""The links the database does not check: which they are, and that an orphan is found.

The rows every run and step writes link to their parents by foreign keys PostgreSQL no
longer checks at commit (``db_constraint=False``; docs/engine.md, "Links the database
does not check"). ``runs.orphans`` and ``billing.orphans`` look for what such a check
would have refused: here each link's parent row is deleted in SQL, as nothing in the
product does, and the invariant must name the child left behind. ``hierarchy.links``
checks what no foreign key ever did: that a ledger entry's or reservation's run,
attempt and organization agree.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from billing.models import LedgerEntry
from common.invariants import check_all, unchecked_links
from runs.engine.outcomes import Outcome
from runs.models import RunAttempt, Step, StepWait, StepWaitKind
from tests.factories import step
from tests.runs.engine.harness import EngineRun

# Every foreign key the database does not check, as app.Model.field. A link added here
# needs its reasons in docs/engine.md's table; everything else stays checked.
UNCHECKED = {
    "runs.Run.organization",
    "runs.RunAttempt.run",
    "runs.Agent.run",
    "runs.Agent.attempt",
    "runs.Task.run",
    "runs.Task.agent",
    "runs.Step.run",
    "runs.Step.task",
    "runs.Step.handler_for",
    "runs.Step.callback_for",
    "runs.RunEvent.run",
    "runs.StepWait.run",
    "runs.StepWait.step",
    "billing.LedgerEntry.organization",
    "billing.LedgerEntry.run",
    "billing.LedgerEntry.attempt",
    "billing.LedgerEntry.step",
    "billing.Reservation.organization",
    "billing.Reservation.attempt",
}
LINKS = [(app, *link) for app in ("runs", "billing") for link in unchecked_links(app)]


def test_the_unchecked_links_are_those_of_the_rows_each_run_and_step_writes() -> None:
    assert {f"{model._meta.label}.{field.name}" for _, model, field in LINKS} == UNCHECKED


@pytest.fixture
def every_link(engine_run: Callable[..., EngineRun]) -> EngineRun:
    """A run with a row behind every unchecked link: step a completed and charged (its
    events, the attempt's reserve), step b waiting on a callback, and b made a handler of a
    and one of its callback's handlers (links the engine sets on handler steps it creates;
    set directly here); and a's charge as the ledger kept it per step before charges went
    per attempt (the entries that still name a step)."""
    run = engine_run({"name": "links", "agents": [{"name": "g", "tasks": [
        {"name": "t", "steps": [step("a"), step("b")]}
    ]}]})  # fmt: skip
    run.finish("a", Outcome(output={}, cost=Decimal("0.01")))
    a, b = run.step("a"), run.step("b")
    run.claim("b")
    StepWait.objects.create(
        run_id=run.run.pk,
        step=b,
        attempt=1,
        kind=StepWaitKind.CALLBACK,
        expires_at=timezone.now() + timedelta(hours=1),
    )
    Step.objects.filter(pk=b.pk).update(handler_for=a, callback_for=a)
    attempt = RunAttempt.objects.get(run_id=a.run_id, attempt_number=a.attempt_number)
    LedgerEntry.objects.create(
        organization_id=run.run.organization_id,
        run_id=a.run_id,
        attempt=attempt,
        step=a,
        type="charge",
        amount=Decimal("0.01"),
        idempotency_key=f"charge:{a.pk}:1",
        actor="engine",
    )
    return run


def test_a_database_the_engine_wrote_has_no_orphan(every_link: EngineRun) -> None:
    found = check_all("runs.orphans", "billing.orphans")

    assert found == {"runs.orphans": [], "billing.orphans": []}


@pytest.mark.parametrize(
    ("app", "model", "field"), LINKS, ids=[f"{m.__name__}.{f.name}" for _, m, f in LINKS]
)
def test_a_row_whose_parent_was_deleted_in_sql_is_reported(
    every_link: EngineRun, app: str, model: Any, field: Any
) -> None:
    child, parent = (
        model._base_manager.filter(**{f"{field.attname}__isnull": False})
        .values_list("pk", field.attname)
        .first()
    )
    table, column = field.related_model._meta.db_table, field.target_field.column
    with connection.cursor() as cursor:
        # The transaction is rolled back at the test's end: the other links' deferred
        # checks, still declared, never run.
        cursor.execute(f'DELETE FROM "{table}" WHERE "{column}" = %s', [parent])  # noqa: S608
        assert cursor.rowcount == 1

    found = check_all(f"{app}.orphans")[f"{app}.orphans"]

    assert f"{model._meta.verbose_name} {child}: its {field.name} {parent} does not exist" in found


# Links that exist but name the wrong row: the ledger's and reservations' run,
# organization and attempt agree with the rows they name (``hierarchy.links``).
ENTRY_SQL = """
INSERT INTO billing_ledgerentry (id, organization_id, run_id, attempt_id, step_id, type,
                                 amount, idempotency_key, reason, actor, created_at)
SELECT gen_random_uuid(), %(organization)s, %(run)s, a.id, %(step)s, 'charge', 1, 'misfiled',
       '', '', now()
FROM runs_runattempt AS a WHERE a.run_id = %(attempt_of)s
RETURNING id
"""


@pytest.mark.parametrize(
    ("misfiled", "said"),
    [
        ({"attempt_of": "other"}, "its run is not its attempt's"),
        ({"step": "other's step"}, "its run is not its step's"),
        ({"organization": "other's organization"}, "its organization is not its run's"),
    ],
    ids=["attempt", "step", "organization"],
)
def test_a_ledger_entry_naming_another_runs_row_is_reported(
    every_link: EngineRun,
    engine_run: Callable[..., EngineRun],
    misfiled: dict[str, str],
    said: str,
) -> None:
    other = engine_run(
        {"name": "other", "agents": [{"name": "g", "tasks": [{"name": "t", "steps": [step("x")]}]}]}
    )
    run = every_link.run
    names: dict[str, Any] = {
        "other": other.run.pk,
        "other's step": other.step("x").pk,
        "other's organization": other.run.organization_id,
    }
    values: dict[str, Any] = {
        "organization": run.organization_id,
        "run": run.pk,
        "attempt_of": run.pk,
        "step": every_link.step("a").pk,
    } | {key: names[name] for key, name in misfiled.items()}
    with connection.cursor() as cursor:
        cursor.execute(ENTRY_SQL, values)
        (entry,) = cursor.fetchone()

    found = check_all("hierarchy.links")["hierarchy.links"]

    assert found == [f"ledger entry {entry}: {said}"]


def test_a_reservation_naming_another_attempt_number_is_reported(every_link: EngineRun) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE billing_reservation SET attempt_number = 7 WHERE run_id = %s RETURNING id",
            [every_link.run.pk],
        )
        (reservation,) = cursor.fetchone()

    found = check_all("hierarchy.links")["hierarchy.links"]

    assert found == [
        f"reservation {reservation}: run, attempt number or organization differs from its attempt's"
    ]
