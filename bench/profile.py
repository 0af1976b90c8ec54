"""`python -m bench.profile`: where one step's time goes in the engine, in process.

Runs a sequence of no-op steps through the engine without a broker or a worker: each
step is claimed as a worker claims it (``runs.transitions.claim_step``) and its outcome
recorded (``runs.engine.outcomes.record``), under cProfile and Django's query capture.
Prints the time per step, the statements per step by kind, and the functions that took
the most time. The tool itself is not run: what is measured is the engine's own cost,
which is what a no-op step costs on a worker besides the broker hop.

``--starts N`` profiles N starts instead: ``run_start`` of a 5-step plan (many_runs'),
one organization, begun at once as a small run is; it prints the time per start, its
statements, and how long the organization's locks are held (from admission's lock to
the commit), which bounds one organization's starts per second however many clients
start them.

Expects migrated PostgreSQL at DATABASE_URL: ``scripts/bench.sh profile`` (``make
profile``) starts a throwaway one. ``--steps N`` (default 300), ``--top N`` (25).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import re
import sys
import time
from collections import Counter
from decimal import Decimal
from typing import Any


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--starts", type=int, default=0, help="profile N run starts instead")
    parser.add_argument(
        "--executor",
        action="store_true",
        help="run each step as a worker does (orchestrator.executor.execute_step: claim, "
        "condition, parameters, the no-op tool, redaction, record) instead of claim + record",
    )
    args = parser.parse_args(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.local")
    import django

    django.setup()
    from django.conf import settings
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from billing.pricing import tool_price
    from billing.services import credits_grant, organization_create
    from orchestrator.executor import execute_step
    from runs import services
    from runs.engine import control
    from runs.engine.outcomes import Outcome, record
    from runs.engine.start import run_start
    from runs.models import Run, Step
    from runs.transitions import claim_step

    settings.ORCHESTRATOR_DISPATCH_ENABLED = False  # nothing leaves this process
    organization = organization_create(name=f"profile-{time.time_ns()}")
    credits_grant(organization=organization, amount=Decimal(100_000), reason="profile")
    price = tool_price("noop")  # charged as a worker charges it
    if args.starts:
        return _starts(args, organization)

    def sequence() -> tuple[Run, list[int]]:
        steps = [{"name": f"s{index}", "tool": "noop"} for index in range(args.steps)]
        tasks = [{"name": "t", "steps": steps}]
        plan = {"name": "profile", "agents": [{"name": "a", "tasks": tasks}]}
        run = services.run_create(organization=organization, plan=plan, actor="profile")
        run_start(run_id=run.pk)
        control.pick_up(run.pk)
        steps_ = Step.objects.filter(run=run).order_by("position")
        return run, list(steps_.values_list("pk", flat=True))

    def play(run: Run, ids: list[int]) -> float:
        started = time.perf_counter()
        for step_id in ids:
            if args.executor:
                if execute_step(step_id, worker="profile", task_id="profile") != "completed":
                    raise SystemExit(f"step {step_id} did not complete")
                continue
            claimed = claim_step(step_id, worker="profile", task_id="profile", lease_seconds=60)
            if claimed is None:
                raise SystemExit(f"step {step_id} could not be claimed")
            record(step_id, run.pk, claimed["attempts"], Outcome(output={}, cost=price))
        if Run.objects.values_list("status", flat=True).get(pk=run.pk) != "completed":
            raise SystemExit("the run did not complete")
        return (time.perf_counter() - started) / len(ids) * 1000

    plain_ms = play(*sequence())
    run, ids = sequence()
    profile = cProfile.Profile()
    with CaptureQueriesContext(connection) as queries:
        profile.enable()
        profiled_ms = play(run, ids)
        profile.disable()

    how = "executed as a worker does" if args.executor else "claim + record each"
    print(f"{args.steps} sequential no-op steps, {how}, in process, twice:")
    print(f"  {plain_ms:.2f} ms per step; {profiled_ms:.2f} ms under cProfile")
    _statements(queries.captured_queries, args.steps, "step")
    out = io.StringIO()
    pstats.Stats(profile, stream=out).sort_stats("cumulative").print_stats(args.top)
    print(out.getvalue())
    return 0


def _starts(args: argparse.Namespace, organization: Any) -> int:
    """``--starts``: the time of a small run's start, and of its organization's locks."""
    from django.db import connection, transaction
    from django.test.utils import CaptureQueriesContext

    from bench.plans import sequential_plan
    from bench.scenarios import MANY_STEPS
    from runs import services
    from runs.admission import run_admission
    from runs.engine.start import run_start

    held: list[float] = []
    on_start = run_admission.on_start

    def timed_on_start(run: Any) -> bool:
        # From the lock (its decision's statement takes it first) to the commit's end:
        # what one organization's starts queue for.
        taken = time.perf_counter()
        transaction.on_commit(lambda: held.append(time.perf_counter() - taken))
        return on_start(run)

    run_admission.on_start = timed_on_start

    def created(count: int) -> list[Any]:
        plan = sequential_plan(MANY_STEPS)
        return [
            services.run_create(organization=organization, plan=plan, actor="profile").pk
            for _ in range(count)
        ]

    def starts(ids: list[Any]) -> float:
        started = time.perf_counter()
        for run_id in ids:
            if run_start(run_id=run_id).status != "running":
                raise SystemExit(f"run {run_id} was not begun at its start")
        return (time.perf_counter() - started) / len(ids) * 1000

    plain_ms = starts(created(args.starts))
    plain_held = sorted(held)[len(held) // 2]
    held.clear()
    ids = created(args.starts)
    profile = cProfile.Profile()
    with CaptureQueriesContext(connection) as queries:
        profile.enable()
        profiled_ms = starts(ids)
        profile.disable()
    print(f"{args.starts} starts of a {MANY_STEPS}-step run, one organization, in process:")
    print(f"  {plain_ms:.2f} ms per start; {profiled_ms:.2f} ms under cProfile")
    print(
        f"  the organization's locks held {plain_held * 1000:.2f} ms per start (median): "
        f"at most {1 / plain_held:.0f} starts/s for one organization, however many start them"
    )
    _statements(queries.captured_queries, args.starts, "start")
    out = io.StringIO()
    pstats.Stats(profile, stream=out).sort_stats("cumulative").print_stats(args.top)
    print(out.getvalue())
    return 0


def _statements(captured: list[dict[str, Any]], per: int, unit: str) -> None:
    kinds = Counter(_kind(query["sql"]) for query in captured)
    spent: dict[str, float] = {}
    for query in captured:  # Django's wall time of each, driver included
        kind = _kind(query["sql"])
        spent[kind] = spent.get(kind, 0.0) + float(query["time"])
    print(f"  {len(captured) / per:.1f} statements per {unit}:")
    print(f"    per {unit}  ms per {unit}  statement")
    for kind, count in kinds.most_common():
        print(f"    {count / per:8.2f}  {spent[kind] / per * 1000:11.2f}  {kind}")


def _kind(sql: str) -> str:
    """A statement's verb and table, e.g. ``UPDATE runs_task`` (savepoints by name)."""
    text = sql.strip()
    if not text:
        return "(raw SQL)"
    if text.upper().startswith(("SAVEPOINT", "RELEASE SAVEPOINT", "ROLLBACK TO")):
        return text.split('"')[0].strip()
    verb = "WITH" if text.upper().startswith("WITH") else text.split()[0].upper()
    table = re.search(r'(?:FROM|INTO|UPDATE)\s+"?(\w+)"?', text, re.IGNORECASE)
    return f"{verb} {table.group(1) if table else ''}".strip()


if __name__ == "__main__":
    sys.exit(main())
