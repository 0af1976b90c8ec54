"""The hot path's statements touch rows in proportion to the step, not to the tables.

Each shape is planned by PostgreSQL from its statistics. After the database grew by
thousands of other steps and ledger entries of the same organization (and was
analysed, as autovacuum would), each shape is run under ``EXPLAIN ANALYZE`` (then
rolled back) for a step of a fresh run, and no part of its plan may touch more than a
few dozen rows: a plan whose cost grows with the tables, not with the step, fails.

Tables not yet analysed are another hazard, not pinned here (what the planner then
knows depends on the tests that ran before): measured by hand, they had led to a
charge's idempotency check filtering every ledger entry of the organization, a task's
successors found through an index of every step, and the steps to update joined by a
scan of the step table; the statements and indexes were changed so that they do not.
"""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import pytest
from django.db import connection, transaction
from django.utils import timezone

from billing.models import Organization
from common.statements import Statement
from runs import services, transitions
from runs.engine import control, hotpath
from runs.models import Run, Step
from runs.transitions import claim_step
from tests import factories
from tests.factories import step

pytestmark = pytest.mark.django_db

GROWTH = 4000  # other steps, and other ledger entries of the same organization
MOST = 50  # rows any part of a plan may touch: the step's own neighbourhood
TABLES = (
    "runs_run",
    "runs_agent",
    "runs_task",
    "runs_step",
    "runs_runevent",
    "billing_ledgerentry",
    "billing_reservation",
    "billing_organization",
)


def parallel() -> dict[str, Any]:
    steps = [step(f"p{i}") for i in range(4)]
    return {
        "name": "wide",
        "agents": [{"name": "a", "tasks": [{"name": "t", "mode": "parallel", "steps": steps}]}],
    }


def dag() -> dict[str, Any]:
    return {
        "name": "dag",
        "agents": [
            {
                "name": "a",
                "mode": "dag",
                "tasks": [
                    {"name": "root", "steps": [step("r")]},
                    {"name": "left", "depends_on": ["root"], "steps": [step("l")]},
                    {"name": "right", "depends_on": ["root"], "steps": [step("x"), step("y")]},
                ],
            }
        ],
    }


SHAPES = {
    "a step among others": (parallel, "p0", hotpath._IN_TASK_SQL),
    "a task's last step": (dag, "r", hotpath._LAST_IN_TASK_SQL),
    "the run's last step": (lambda: factories.plan(steps=1), "step-0", hotpath._LAST_IN_RUN_SQL),
}


def touched(node: dict[str, Any], path: str = "") -> list[tuple[int, str]]:
    """(rows read, where) for a plan node and everything under it (CTEs included)."""
    where = f"{path}/{node.get('Subplan Name') or node['Node Type']}"
    if "Relation Name" in node:
        where += f" on {node['Relation Name']} ({node.get('Index Name', 'no index')})"
    loops = int(node.get("Actual Loops", 1))
    read = loops * int(node.get("Actual Rows", 0)) + int(node.get("Rows Removed by Filter", 0))
    read += int(node.get("Rows Removed by Index Recheck", 0))
    found = [(read, where)] if "Relation Name" in node else []
    for child in node.get("Plans", []):
        found += touched(child, where)
    return found


def plan_of_recording(
    organization: Organization, plan: dict[str, Any], name: str, sql: Statement
) -> dict[str, Any]:
    run = services.run_create(organization=organization, plan=plan)
    services.run_start(run_id=run.pk)
    assert control.pick_up(run.pk)
    run = Run.objects.get(pk=run.pk)
    target = Step.objects.get(run=run, name=name)
    claimed = claim_step(target.pk, worker="test", task_id="t", lease_seconds=60)
    assert claimed is not None
    params = hotpath._params(
        run,
        target.pk,
        claimed["attempts"],
        output={"n": 1},
        cost=Decimal("0.001"),
        now=timezone.now(),
        beat=False,
    )
    top = explained(sql, params)
    assert top.get("Actual Rows", 0) >= 1, "the shape did not apply: the test measures nothing"
    return top


def grow(organization: Organization) -> None:
    """Thousands of other steps (two other runs', picked up: one whose steps are held by
    its concurrency limit, one whose steps are all claimable) and ledger entries of the
    same organization (grants written directly, its balance kept in step with them)."""
    for limit in (1, GROWTH // 2):
        task = {
            "name": "t",
            "mode": "parallel",
            "max_concurrent_steps": limit,
            "steps": [step(f"s{i}") for i in range(GROWTH // 2)],
        }
        other = services.run_create(
            organization=organization,
            plan={"name": "bulk", "agents": [{"name": "a", "tasks": [task]}]},
        )
        services.run_start(run_id=other.pk)
        assert control.pick_up(other.pk)
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO billing_ledgerentry (id, organization_id, type, amount, "
            "idempotency_key, reason, actor, created_at) "
            "SELECT gen_random_uuid(), %s, 'grant', 1, 'bulk:' || n, 'test', 'test', now() "
            "FROM generate_series(1, %s) AS n",
            [organization.pk, GROWTH],
        )
        cursor.execute(
            "UPDATE billing_organization SET credits_available = credits_available + %s "
            "WHERE id = %s",
            [GROWTH, organization.pk],
        )
        # Statistics as autovacuum keeps them on tables that grew: without this, what the
        # planner knows depends on which tests ran before (an earlier test's rows, an
        # ANALYZE at some moment of the session), and so would the plans.
        for table in TABLES:
            cursor.execute(f"ANALYZE {table}")


def explained(sql: str | Statement, params: dict[str, Any]) -> dict[str, Any]:
    """The plan of ``sql`` as it ran (then rolled back)."""
    if isinstance(sql, Statement):
        sql = sql.text
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, params)
            (report,) = cursor.fetchone()
        transaction.set_rollback(True)
    plan: dict[str, Any] = (report if isinstance(report, list) else json.loads(report))[0]["Plan"]
    return plan


def test_no_part_of_the_starts_plan_grows_with_the_tables() -> None:
    organization = factories.org(credits=1000)
    grow(organization)
    run = services.run_create(organization=organization, plan=dag())
    services.run_start(run_id=run.pk)
    run, picked = services.run_pick_up(run_id=run.pk)  # materialised, not yet started
    assert picked

    plan = explained(hotpath._START_SQL, {"run": run.pk, "now": timezone.now()})

    assert plan.get("Actual Rows", 0) >= 1, "nothing was started: the test measures nothing"
    wide = [(rows, where) for rows, where in touched(plan) if rows > MOST]
    assert wide == [], f"parts of the plan that read more than {MOST} rows: {wide}"


def test_no_part_of_the_claims_plan_grows_with_the_tables() -> None:
    organization = factories.org(credits=1000)
    grow(organization)
    run = services.run_create(organization=organization, plan=parallel())
    services.run_start(run_id=run.pk)
    assert control.pick_up(run.pk)

    plan = explained(
        transitions._CLAIM_NEXT_SQL, {"run": run.pk, "lease": 60, "worker": "test", "task_id": "t"}
    )

    assert plan.get("Actual Rows", 0) == 1, "nothing was claimed: the test measures nothing"
    wide = [(rows, where) for rows, where in touched(plan) if rows > MOST]
    assert wide == [], f"parts of the plan that read more than {MOST} rows: {wide}"


@pytest.mark.parametrize("shape", list(SHAPES))
def test_no_part_of_a_shapes_plan_grows_with_the_tables(shape: str) -> None:
    plan, name, sql = SHAPES[shape]
    organization = factories.org(credits=1000)
    grow(organization)

    explained = plan_of_recording(organization, plan(), name, sql)

    wide = [(rows, where) for rows, where in touched(explained) if rows > MOST]
    assert wide == [], f"parts of the plan that read more than {MOST} rows: {wide}"


def probes(node: dict[str, Any]) -> list[tuple[int, str]]:
    """(loops, where) of every index scan given a list of ids (``= ANY``) to probe."""
    found = []
    condition = str(node.get("Index Cond", ""))
    if "ANY" in condition:
        found.append((int(node.get("Actual Loops", 1)), f"{node['Node Type']}: {condition}"))
    for child in node.get("Plans", []):
        found += probes(child)
    return found


WIDE = 600  # steps started at once by the wide start below


def test_a_wide_start_probes_its_ids_once() -> None:
    # A statement that joined a wide set of ids and also gave them as an index condition
    # let a nested loop probe every id once per row: a 20,000-step pick-up under a plan
    # made while the step table was small did not end in a quarter of an hour (found by
    # the noisy_neighbour bench). Statistics taken while the table is small, as a fresh
    # database has them: each list of ids must still be probed once.
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE runs_step")
    organization = factories.org(credits=1000)
    task = {
        "name": "t",
        "mode": "parallel",
        "max_concurrent_steps": WIDE,
        "steps": [step(f"s{i}") for i in range(WIDE)],
    }
    tasks = [task, {**task, "name": "u"}]
    spec = {"name": "wide-start", "agents": [{"name": "a", "mode": "parallel", "tasks": tasks}]}
    run = services.run_create(organization=organization, plan=spec)
    services.run_start(run_id=run.pk)
    run, picked = services.run_pick_up(run_id=run.pk)  # materialised, not yet started
    assert picked

    plan = explained(hotpath._START_SQL, {"run": run.pk, "now": timezone.now()})

    assert plan.get("Actual Rows", 0) >= 2 * WIDE, "the start did not apply: it measures nothing"
    repeated = [(loops, where) for loops, where in probes(plan) if loops > 1]
    assert repeated == [], f"id lists probed more than once: {repeated}"
