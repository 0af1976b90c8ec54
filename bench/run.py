"""`python -m bench.run`: the engine against raw Celery, in one run, one table.

Starts ONE Celery worker (prefork, ``BENCH_WORKERS`` children, default 2) consuming the
engine queues and the ``bench`` queue of the raw baselines, warms it up, records its
memory, runs every scenario (``BENCH_REPEAT`` times, default once; medians are
reported), stops the worker and prints the side-by-side table and the goals. With
``BENCH_JSON=path`` every figure is also written there as JSON. Figures are reported,
never asserted: the exit code is 0 unless the harness itself could not run.

The many-runs scenarios submit from ``BENCH_CLIENTS`` client processes (default 8,
``bench.clients``), started on the first of them; ``many_runs_api`` to a gunicorn
started for it (``bench.web``). Both are stopped at the end.

Expects migrated PostgreSQL and Redis at DATABASE_URL and CELERY_BROKER_URL:
``scripts/bench.sh`` (``make bench``) starts throwaway ones.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from .clients import Clients
from .procs import CpuMeter, own_seconds, parent_of, redis_seconds, tree_seconds
from .report import NOTES, Figure, Goal, format_extras, format_table, goals, table_rows
from .worker import Worker, WorkerFailed

if TYPE_CHECKING:
    from .scenarios import Engine, Raw, Sample
    from .web import Web

SETTLE_S = 0.5  # pause between scenarios, so one's stragglers do not slow the next
# Scenarios measured on a worker started with these settings (then restarted without).
WORKER_ENV = {"noisy_neighbour_unfair": {"ENGINE_FAIR_DISPATCH": "0"}}
# Scenarios measured on a worker of BENCH_WIDE_WORKERS children (default 32): one run's
# spread over a wide fleet. Sleeping costs no CPU, so two cores hold 32 sleeping slots.
WIDE = ("fan_sleep", "group_sleep", "fan_2000_wide", "group_2000_wide")


@dataclass(frozen=True)
class Setup:
    """The worker a scenario is measured on: its children and its environment."""

    children: int
    env: tuple[tuple[str, str], ...] = ()


def setup_of(name: str, args: argparse.Namespace) -> Setup:
    children = args.wide_workers if name in WIDE else args.workers
    return Setup(children, tuple(sorted(WORKER_ENV.get(name, {}).items())))


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "").strip()
    return int(value) if value else default


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, default=_env_int("BENCH_WORKERS", 2))
    parser.add_argument(
        "--wide-workers",
        type=int,
        default=_env_int("BENCH_WIDE_WORKERS", 32),
        help="children of the worker the wide scenarios run on (BENCH_WIDE_WORKERS, default 32)",
    )
    parser.add_argument("--repeat", type=int, default=_env_int("BENCH_REPEAT", 1))
    parser.add_argument(
        "--clients",
        type=int,
        default=_env_int("BENCH_CLIENTS", 8),
        help="client processes the many-runs scenarios submit from (BENCH_CLIENTS, default 8)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=float(_env_int("BENCH_TIMEOUT", 600)),
        help="seconds each scenario may take (BENCH_TIMEOUT, default 600)",
    )
    parser.add_argument("--json", default=os.environ.get("BENCH_JSON", ""), help="BENCH_JSON")
    parser.add_argument(
        "--dir",
        default=os.environ.get("BENCH_DIR", ""),
        help="where the worker log goes (BENCH_DIR; default a new temporary directory)",
    )
    parser.add_argument("--only", default="", help="comma-separated scenario names (default: all)")
    parser.add_argument(
        "--no-analyze",
        action="store_true",
        help="do not ANALYZE before each scenario: measure a database whose statistics are"
        " as fresh as autovacuum left them (BENCH_NO_ANALYZE=1)",
        default=os.environ.get("BENCH_NO_ANALYZE", "") == "1",
    )
    args = parser.parse_args(argv)
    if min(args.workers, args.wide_workers, args.repeat, args.clients) < 1 or args.timeout <= 0:
        parser.error(
            "--workers, --wide-workers, --repeat and --clients must be at least 1, --timeout"
            " positive"
        )
    return args


def scenario_table() -> list[tuple[str, str, int, Callable[[Engine, Raw], Sample]]]:
    """(name, kind, steps, how to run it), in the order they run: pairs side by side.

    The widest come last: fan_20000 takes minutes.
    """
    from .plans import (
        SLEEP_WIDTH,
        WIDE_FAN_WIDTH,
        dag_plan,
        fan_plan,
        sequential_plan,
        wide_fan_plan,
    )
    from .runner_jobs import JOBS, runner_jobs
    from .scenarios import MANY_ORGS, MANY_RUNS, MANY_STEPS

    many = MANY_RUNS * MANY_STEPS
    wide = WIDE_FAN_WIDTH + 1  # and the join

    return [
        ("seq_100", "engine", 100, lambda e, r: e.run(sequential_plan(100), 100)),
        ("chain_100", "raw", 100, lambda e, r: r.chain(100)),
        ("seq_1000", "engine", 1000, lambda e, r: e.run(sequential_plan(1000), 1000)),
        ("chain_1000", "raw", 1000, lambda e, r: r.chain(1000)),
        ("fan_2000", "engine", 2001, lambda e, r: e.run(fan_plan(2000), 2001)),
        # fan_2000 of a decorated tool of the fleet's (bench/fleet_tools.py).
        ("fan_2000_tool", "engine", 2001, lambda e, r: e.fan_fleet_tool(2000)),
        ("group_2000", "raw", 2000, lambda e, r: r.group(2000)),
        ("chord_2000", "raw", 2001, lambda e, r: r.chord(2000)),
        ("dag_1000", "engine", 1000, lambda e, r: e.run(dag_plan(1000), 1000)),
        ("start_latency", "engine", 1, lambda e, r: e.start_latency()),
        ("start_latency_raw", "raw", 1, lambda e, r: r.start_latency()),
        # BENCH_CLIENTS client processes submit these (bench.clients): one organization;
        # raw Celery; MANY_ORGS organizations (whose raw twin is many_chains: raw Celery
        # has none); one organization through the API's gunicorn (bench.web).
        ("many_runs", "engine", many, lambda e, r: e.many_runs()),
        ("many_chains", "raw", many, lambda e, r: r.many_chains()),
        ("many_runs_orgs", "engine", many, lambda e, r: e.many_runs(organizations=MANY_ORGS)),
        ("many_runs_api", "engine", many, lambda e, r: e.many_runs_api()),
        # Jobs served on a host through the API's gunicorn (bench.runner_jobs): one
        # `orch worker`, then the reference runner.
        ("runner_jobs", "engine", JOBS, lambda e, r: runner_jobs(e)),
        ("runner_jobs_reference", "engine", JOBS, lambda e, r: runner_jobs(e, reference=True)),
        ("fan_20000", "engine", wide, lambda e, r: e.run(wide_fan_plan(WIDE_FAN_WIDTH), wide)),
        ("group_20000", "raw", 20_000, lambda e, r: r.group(20_000)),
        ("noisy_neighbour", "engine", wide, lambda e, r: e.noisy_neighbour()),
        # The worker is restarted for the scenarios below (memory over the pass is
        # measured before the first restart). On BENCH_WIDE_WORKERS children (WIDE): one
        # run over a wide fleet.
        ("fan_sleep", "engine", SLEEP_WIDTH + 1, lambda e, r: e.fan_sleep()),
        ("group_sleep", "raw", SLEEP_WIDTH, lambda e, r: r.group_sleep()),
        ("fan_2000_wide", "engine", 2001, lambda e, r: e.run(fan_plan(2000), 2001)),
        ("group_2000_wide", "raw", 2000, lambda e, r: r.group(2000)),
        # The same with fair dispatch off (ENGINE_FAIR_DISPATCH=0, for this measurement
        # only): the worker is restarted with it for this scenario (WORKER_ENV).
        ("noisy_neighbour_unfair", "engine", wide, lambda e, r: e.noisy_neighbour()),
    ]


def warm_up(engine: Engine, raw: Raw, children: int) -> list[str]:
    """Small runs of every kind, and sleeps two per child, so that each child has
    imported and connected."""
    from .plans import dag_plan, fan_plan, sequential_plan

    samples = {
        "engine seq_10": engine.run(sequential_plan(10), 10),
        "engine fan_20": engine.run(fan_plan(20), 21),
        "engine dag_20": engine.run(dag_plan(20), 20),
        "engine sleeps": engine.fan_sleep(2 * children, 0.02),
        "raw chain_10": raw.chain(10),
        "raw group_20": raw.group(20),
        "raw chord_20": raw.chord(20),
        "raw sleeps": raw.group_sleep(2 * children, 0.02),
        "raw start latency": raw.start_latency(3),
    }
    return [f"{name}: {sample.error}" for name, sample in samples.items() if sample.error]


def cpu_meter(
    workers: Callable[[], list[int]], clients: Clients, web: Web | None = None
) -> CpuMeter | None:
    """The many-runs scenarios' CPU by owner: PostgreSQL's processes (its postmaster's
    tree, the backends that ended meanwhile included), the workers' trees (``workers``:
    their pids now; a worker may be restarted), the client processes, gunicorn's, Redis
    (``INFO cpu``) and this process. None where PostgreSQL does not run on this host."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        backend = cursor.fetchone()[0]
    try:
        postmaster = parent_of(backend)
    except OSError:
        return None
    broker = os.environ["CELERY_BROKER_URL"]

    def web_seconds() -> float | None:
        pid = web.pid() if web is not None else None
        return tree_seconds(pid) if pid is not None else None

    return CpuMeter(
        {
            "postgres": lambda: tree_seconds(postmaster),
            "worker": lambda: sum(tree_seconds(pid) for pid in workers()),
            "clients": lambda: sum(tree_seconds(pid) for pid in clients.pids()),
            "web": web_seconds,
            "redis": lambda: redis_seconds(broker),
            "bench": own_seconds,
        }
    )


def analyze() -> None:
    """Fresh planner statistics before a scenario, as on a server that has been running.

    The bench's database is minutes old: autovacuum (one look a minute) has not analysed
    its tables yet, so PostgreSQL plans the engine's statements for the near-empty tables
    it last measured, and the worker's connections keep those plans (prepared statements)
    until an ANALYZE invalidates them: by the dag scenario, index lookups had become
    walks of whole tables. On a running server autovacuum analyses a table once a tenth
    of it has changed. ``--no-analyze`` measures the fresh database instead.
    """
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")


def print_report(header: str, figures: dict[str, Figure], verdicts: list[Goal]) -> None:
    print(f"\n{header}\n")
    print(format_table(figures))
    extras = format_extras(figures)
    if extras:
        print("\nFurther figures (medians):")
        print("\n".join(extras))
    print()
    for note in NOTES:
        print(f"  {note}")
    for figure in figures.values():
        if figure.failed:
            print(f"  {figure.name} failed: {figure.error}")
    print("\nGoals (informational):")
    for goal in verdicts:
        print(goal.line())


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def start_collector() -> subprocess.Popen[bytes] | None:
    """``BENCH_TRACING=1``: a local OTLP/HTTP collector (``bench.collector``, which
    accepts and discards) and OTEL_EXPORTER_OTLP_ENDPOINT pointing at it, for this
    process (it creates the runs) and the worker (it inherits the environment)."""
    if os.environ.get("BENCH_TRACING", "") != "1":
        return None
    port_file = Path(tempfile.mkdtemp(prefix="bench-otlp-")) / "port"
    command = [sys.executable, "-m", "bench.collector", "--port-file", str(port_file)]
    collector = subprocess.Popen(command)
    deadline = time.monotonic() + 30
    while not port_file.exists():
        if collector.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("the OTLP collector did not start")
        time.sleep(0.05)  # another process's state: its port file
    os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"http://127.0.0.1:{port_file.read_text()}"
    os.environ.setdefault("OTEL_SERVICE_NAME", "orchestrator-bench")
    return collector


def stop_collector(collector: subprocess.Popen[bytes] | None) -> None:
    if collector is None:
        return
    from config import otel

    otel.flush()
    collector.terminate()
    collector.wait(10)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.local")
    collector = start_collector()
    try:
        return _main(args)
    finally:
        stop_collector(collector)


def _main(args: argparse.Namespace) -> int:
    import django

    django.setup()
    from config import otel

    tracing = otel.setup_from_settings("bench")
    from .scenarios import Engine, Raw
    from .web import Web

    signal.signal(signal.SIGTERM, _terminate)
    selected = scenario_table()
    if args.only:
        wanted = {name.strip() for name in args.only.split(",") if name.strip()}
        unknown = wanted - {name for name, *_ in selected}
        if unknown:
            _say(f"unknown scenario(s): {', '.join(sorted(unknown))}")
            return 2
        selected = [entry for entry in selected if entry[0] in wanted]

    workdir = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="bench-"))
    worker = Worker(args.workers, workdir / "worker.log")
    clients, web = Clients(args.clients), Web(workdir)
    figures = {name: Figure(name, kind, steps) for name, kind, steps, _ in selected}
    # Worker memory over the pass: from after the warm-up until the end, or until the
    # first restart (the last scenarios run on a worker restarted for them).
    # Of the growth, what the engine's scenarios and raw Celery's each added (the KiB
    # over each of them, summed by kind): both run on this one worker.
    rss: dict[str, int | None] = {
        "before_warm_up": None,
        "start": None,
        "end": None,
        "grown_engine": 0,
        "grown_raw": 0,
    }
    warm_up_errors: list[str] = []
    aborted = ""
    started_at = datetime.now(UTC)
    load = {"before": os.getloadavg()[0], "after": 0.0}
    try:
        _say(f"==> starting a worker: prefork, {args.workers} children (log {worker.log_path})")
        worker.start()
        rss["before_warm_up"] = worker.rss_kib()
        meter = cpu_meter(lambda: [worker.pid], clients, web)
        engine = Engine(args.timeout, worker.alive, clients=clients, web=web, meter=meter)
        raw = Raw(args.timeout, worker.alive, clients=clients, meter=meter)
        engine.slots = raw.slots = args.workers
        _say("==> warming up")
        warm_up_errors = warm_up(engine, raw, args.workers)
        for problem in warm_up_errors:
            _say(f"    warm-up failed: {problem}")
        time.sleep(1)
        rss["start"] = worker.rss_kib()
        current, restarted = Setup(args.workers), False
        for repeat in range(args.repeat):
            if args.repeat > 1:
                _say(f"==> pass {repeat + 1} of {args.repeat}")
            for name, _kind, _steps, scenario in selected:
                if not worker.alive():
                    raise WorkerFailed("the worker died")
                setup = setup_of(name, args)
                if setup != current:
                    if not restarted:
                        rss["end"] = worker.rss_kib()
                    env = dict(setup.env)
                    _say(f"    (restarting the worker: {setup.children} children {env})")
                    worker.restart(setup.children, **env)
                    engine.slots = raw.slots = setup.children
                    for problem in warm_up(engine, raw, setup.children):
                        _say(f"    warm-up failed: {problem}")
                    current, restarted = setup, True
                if not args.no_analyze:
                    analyze()
                rss_before = worker.rss_kib()
                sample = scenario(engine, raw)
                figure = figures[name]
                if sample.error is not None:
                    figure.errors.append(sample.error)
                    _say(f"    {name:<18} failed: {sample.error}")
                elif sample.wall_s is not None:
                    figure.walls.append(sample.wall_s)
                    figure.add_extra(sample.extra)
                    more = "".join(f", {key} {value:.3f}" for key, value in sample.extra.items())
                    _say(f"    {name:<18} {sample.wall_s:8.3f} s{more}")
                time.sleep(SETTLE_S)
                rss_after = worker.rss_kib()
                figure.rss_kib.append((rss_before, rss_after))
                if not restarted:
                    grown = f"grown_{figure.kind}"
                    rss[grown] = (rss[grown] or 0) + rss_after - rss_before
        time.sleep(1)
        if not worker.alive():
            raise WorkerFailed("the worker died")
        if not restarted:
            rss["end"] = worker.rss_kib()
        load["after"] = os.getloadavg()[0]
    except WorkerFailed as exc:
        aborted = str(exc)
        _say(f"benchmark aborted: {aborted}")
    except KeyboardInterrupt:
        _say("interrupted: stopping the worker")
        return 130
    finally:
        clients.close()
        web.stop()
        worker.stop()

    verdicts = goals(figures, rss)
    header = (
        f"Engine vs raw Celery: 1 worker, prefork, {args.workers} children ({args.wide_workers} "
        f"for {', '.join(WIDE)}); {args.clients} clients submitting the many-runs scenarios "
        f"(gunicorn: {web.workers} workers); {args.repeat} "
        f"pass(es), medians; ANALYZE before each scenario: {'no' if args.no_analyze else 'yes'}; "
        f"{os.cpu_count()} CPUs, 1-min load average {load['before']:.2f} "
        f"before, {load['after']:.2f} after; tracing "
        f"{'on (OTLP/HTTP to a local collector)' if tracing else 'off'}"
    )
    print_report(header, figures, verdicts)
    problems = worker.log_problems()
    if aborted:
        print(f"\nBenchmark aborted: {aborted}; the figures above are partial.")
    if aborted or problems or warm_up_errors or any(f.failed for f in figures.values()):
        print(f"\nWorker log: {len(problems)} error line(s); tail of {worker.log_path}:")
        print(worker.log_tail())
    if args.json:
        report: dict[str, Any] = {
            "started_at": started_at.isoformat(),
            "config": {
                "workers": args.workers,
                "wide_workers": args.wide_workers,
                "pool": "prefork",
                "repeat": args.repeat,
                "clients": args.clients,
                "web_workers": web.workers,
                "analyze_before_each_scenario": not args.no_analyze,
                "timeout_s": args.timeout,
                "settings": os.environ.get("DJANGO_SETTINGS_MODULE"),
                "python": platform.python_version(),
                "cpus": os.cpu_count(),
                "tracing": tracing,
                "load_average_1min": load,
            },
            "aborted": aborted or None,
            "worker_rss_kib": rss,
            "warm_up_errors": warm_up_errors,
            "scenarios": {name: figure.as_dict() for name, figure in figures.items()},
            "table": [
                {key: value for key, value in row.items() if key != "cells"}
                for row in table_rows(figures)
            ],
            "goals": {goal.key: goal.as_dict() for goal in verdicts},
            "worker_log_errors": problems[:50],
        }
        path = Path(args.json)
        path.write_text(json.dumps(report, indent=2) + "\n")
        print(f"\nJSON written to {path}")
    return 1 if aborted else 0


if __name__ == "__main__":
    sys.exit(main())
