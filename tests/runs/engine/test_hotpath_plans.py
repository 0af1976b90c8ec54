"""The hot path's statements touch rows in proportion to the step, not to the tables.

Each statement of the database's functions (the apps' sql/ folders) is planned by
PostgreSQL from its statistics. After the database grew by thousands of other steps and ledger
entries of the same organization (and was analysed, as autovacuum would), each shape is
run for a step of a fresh run (then rolled back) with ``auto_explain`` reporting the plan
of every statement the functions ran, as it ran (``EXPLAIN ANALYZE``), and no part of any
plan may touch more than a few dozen rows: a plan whose cost grows with the tables, not
with the step, fails.

Tables not yet analysed are another hazard, not pinned here (what the planner then
knows depends on the tests that ran before): measured by hand, they had led to a
charge's idempotency check filtering every ledger entry of the organization, a task's
successors found through an index of every step (the handler index, which held every
step with NULL; partial since, it holds handlers only), and the steps to update joined
by a scan of the step table; the statements and indexes were changed so that they do
not.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.db import connection, transaction

from billing.models import Organization
from runs import services
from runs.engine import control
from runs.engine.start import run_start
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


# A shape of runs.step_completed, the step recorded, the shape's name in its rows, and
# whether the recording claims the worker's next step (the step it makes ready, held for
# that claim: runs.step_claimed_next, runs.step_claim's `p_held`).
SHAPES = {
    "a step among others": (parallel, "p0", "in_task", False),
    "a task's last step": (dag, "r", "last_in_task", False),
    "the run's last step": (lambda: factories.plan(steps=1), "step-0", "last_in_run", False),
    "a sequence's step, claiming the next": (
        lambda: factories.plan(steps=3),
        "step-0",
        "in_task",
        True,
    ),
    "a task's last step, claiming the next task's first": (dag, "r", "last_in_task", True),
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


def plans_of_recording(
    organization: Organization, plan: dict[str, Any], name: str, shape: str, claim: bool
) -> list[dict[str, Any]]:
    run = services.run_create(organization=organization, plan=plan)
    run_start(run_id=run.pk)
    assert control.pick_up(run.pk)
    run = Run.objects.get(pk=run.pk)
    target = Step.objects.get(run=run, name=name)
    claimed = claim_step(target.pk, worker="test", task_id="t", lease_seconds=60)
    assert claimed is not None
    rows, plans = explained(
        "SELECT * FROM runs.step_completed(%s, %s, %s, %s, 0.001, '0.001', 0.001, %s, "
        "'test', 't', 60, false, '', '{}', '{}', NULL)",
        [target.pk, claimed["attempts"], run.pk, json.dumps({"n": 1}), claim],
    )
    assert [row[0] for row in rows][:1] == [shape], "the shape did not apply: it measures nothing"
    if claim:
        assert rows[-1][0] == "claimed", "nothing was claimed: the claim measures nothing"
    return plans


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
        run_start(run_id=other.pk)
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


@contextmanager
def nested_plans() -> Iterator[list[dict[str, Any]]]:
    """The plan of every statement run meanwhile, functions' statements included, as it
    ran (``auto_explain`` with ANALYZE, its log sent to this session as notices)."""
    plans: list[dict[str, Any]] = []

    def noticed(diagnostic: Any) -> None:
        text = diagnostic.message_primary or ""
        if text.startswith("duration:") and "{" in text:
            plans.append(json.loads(text[text.index("{") :])["Plan"])

    connection.ensure_connection()
    raw = connection.connection
    raw.add_notice_handler(noticed)
    try:
        with connection.cursor() as cursor:
            cursor.execute("LOAD 'auto_explain'")
            for setting, value in (
                ("auto_explain.log_min_duration", "0"),
                ("auto_explain.log_analyze", "on"),
                ("auto_explain.log_nested_statements", "on"),
                ("auto_explain.log_format", "json"),
                ("client_min_messages", "log"),
            ):
                cursor.execute("SELECT set_config(%s, %s, true)", [setting, value])
        yield plans
    finally:
        raw.remove_notice_handler(noticed)


def explained(
    sql: str, params: list[Any], plan_cache_mode: str = "force_custom_plan"
) -> tuple[list[tuple[Any, ...]], list[dict[str, Any]]]:
    """The rows of ``sql`` and the plans of every statement it ran (then rolled back),
    each planned for the values it ran with (``force_custom_plan``): the session's cached
    plans are dropped first, and the mode set, so that what earlier tests made the
    functions' statements plan for does not decide what is measured. With ``auto`` the
    plan cache chose by the statement's history in the session, and `run_begin`'s steps
    once read 4,004 rows in a run of a subset of the suite (passing alone and in every
    full run). ``force_generic_plan``: each planned for any value instead, as PL/pgSQL
    may keep it."""
    with transaction.atomic(), nested_plans() as plans:
        with connection.cursor() as cursor:
            cursor.execute("DISCARD PLANS")
            cursor.execute("SELECT set_config('plan_cache_mode', %s, true)", [plan_cache_mode])
            cursor.execute(sql, params)
            rows = cursor.fetchall()
        transaction.set_rollback(True)
    # The functions' own statements were seen, not only the call (a Function Scan).
    assert any("Relation Name" in str(plan) for plan in plans), "auto_explain saw nothing"
    return rows, plans


def wide_parts(plans: list[dict[str, Any]]) -> list[tuple[int, str]]:
    return [(rows, where) for plan in plans for rows, where in touched(plan) if rows > MOST]


def test_no_part_of_the_starts_plan_grows_with_the_tables() -> None:
    organization = factories.org(credits=1000)
    grow(organization)
    run = services.run_create(organization=organization, plan=dag())
    run_start(run_id=run.pk)
    run, picked = services.run_pick_up(run_id=run.pk)  # materialised, not yet started
    assert picked

    rows, plans = explained("SELECT * FROM runs.run_begin(%s, now())", [run.pk])

    assert rows, "nothing was started: the test measures nothing"
    wide = wide_parts(plans)
    assert wide == [], f"parts of the plans that read more than {MOST} rows: {wide}"


def test_no_part_of_the_claims_plan_grows_with_the_tables() -> None:
    organization = factories.org(credits=1000)
    grow(organization)
    run = services.run_create(organization=organization, plan=parallel())
    run_start(run_id=run.pk)
    assert control.pick_up(run.pk)

    rows, plans = explained("SELECT * FROM runs.step_claim(NULL, %s, 'test', 't', 60)", [run.pk])

    assert len(rows) == 1, "nothing was claimed: the test measures nothing"
    wide = wide_parts(plans)
    assert wide == [], f"parts of the plans that read more than {MOST} rows: {wide}"


def stale_statistics() -> None:
    """The step table's statistics as they were when few of its steps were pending (the
    thousands grown since are not in them): what the planner then believes."""
    with connection.cursor() as cursor:
        cursor.execute("UPDATE runs_step SET status = 'completed' WHERE status = 'pending'")
        cursor.execute("ANALYZE runs_step")
        cursor.execute("UPDATE runs_step SET status = 'pending' WHERE status = 'completed'")


@pytest.mark.parametrize("plan_cache_mode", ["force_custom_plan", "force_generic_plan"])
@pytest.mark.parametrize("batch", [1, 4])
def test_no_part_of_a_batch_claims_plan_grows_with_the_tables(
    batch: int, plan_cache_mode: str
) -> None:
    # A batch's steps are updated one by one, each by its key: as one statement over
    # the set (`id = ANY (...)`), a generic plan made where the statistics said few steps
    # were pending read every pending step through their partial index.
    organization = factories.org(credits=1000)
    grow(organization)
    stale_statistics()
    task = {"name": "t", "mode": "parallel", "max_concurrent_steps": 100}
    task["steps"] = [step(f"p{i}") for i in range(12)]
    plan = {"name": "wide", "agents": [{"name": "a", "tasks": [task]}]}
    run = services.run_create(organization=organization, plan=plan)
    run_start(run_id=run.pk)
    assert control.pick_up(run.pk)

    rows, plans = explained(
        "SELECT * FROM runs.step_claim(NULL, %s, 'test', 't', 60, now(), %s)",
        [run.pk, batch],
        plan_cache_mode,
    )

    assert len(rows) == batch, "the batch was not claimed: the test measures nothing"
    wide = wide_parts(plans)
    assert wide == [], f"parts of the plans that read more than {MOST} rows: {wide}"


@pytest.mark.parametrize("shape", list(SHAPES))
def test_no_part_of_a_shapes_plan_grows_with_the_tables(shape: str) -> None:
    plan, name, applied, claim = SHAPES[shape]
    organization = factories.org(credits=1000)
    grow(organization)

    plans = plans_of_recording(organization, plan(), name, applied, claim)

    wide = wide_parts(plans)
    assert wide == [], f"parts of the plans that read more than {MOST} rows: {wide}"


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
    run_start(run_id=run.pk)
    run, picked = services.run_pick_up(run_id=run.pk)  # materialised, not yet started
    assert picked

    rows, plans = explained("SELECT * FROM runs.run_begin(%s, now())", [run.pk])

    assert len(rows) >= 2 * WIDE, "the start did not apply: it measures nothing"
    repeated = [(loops, where) for plan in plans for loops, where in probes(plan) if loops > 1]
    assert repeated == [], f"id lists probed more than once: {repeated}"
