"""`python -m bench.capacity` (`scripts/bench.sh capacity`, `make capacity`): what a step
and a small run cost PostgreSQL, the figures docs/capacity.md works from.

One Celery worker (prefork, ``--workers`` children) serves three phases, one after
another, each of no-op steps created (``run_create``) and started (``run_start``) as a
client does:

- ``fan``: one run of ``--fan`` parallel steps and a join; per step;
- ``seq``: one run of ``--seq`` steps one after another; per step;
- ``small``: ``--runs`` runs of 5 sequential steps, started one after another and then
  awaited; per run.

Around each phase it reads what the server counts:

- ``pg_stat_statements`` (track = top: the statements clients sent; a function's own
  statements are its call's): calls, execution time and rows, per statement;
- ``pg_stat_user_tables``: rows inserted, updated (HOT among them) and deleted, per table;
- WAL: bytes between the insert positions before and after, its records by type and
  their full-page images (``pg_walinspect``), from a checkpoint just before; and the
  flushes (``pg_stat_wal``, which also counts the STATS_FLUSH_S after the phase);
- CPU time from ``/proc/<pid>/stat``: PostgreSQL's processes by kind (the time of those
  that ended inside the phase is the postmaster's reaped children's), the worker's, this
  process's, and Redis's (``INFO cpu``).

Its own reads go through a connection of their own, which the figures leave out: not
tracked by pg_stat_statements, its backend's CPU not counted, and it writes nothing.
Expects migrated PostgreSQL with ``pg_stat_statements`` loaded, on this host (its
processes' CPU is read from /proc), and Redis: ``scripts/bench.sh capacity`` starts
throwaway ones, durable (fsync and full-page writes on). Figures are reported, never
asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .procs import descendants, parent_of, proc_seconds, redis_seconds, tree_seconds
from .worker import Worker, WorkerFailed

if TYPE_CHECKING:
    import psycopg

SMALL_STEPS = 5
CORES = (16, 64)  # the primaries docs/capacity.md sizes
POLL_S = 0.1
# After the last run ends: what the worker does after its last commit (a slot given
# back, the organization's waiting runs looked at) belongs to the phase too.
SETTLE_S = 1.0
# PostgreSQL (15, 16) moves a backend's table and WAL counters to the shared statistics
# when it goes idle, at most once a second; what it could not move then waits for its
# next idle report, at most 10 s later (pgstat.c, PGSTAT_IDLE_INTERVAL), and no other
# session can make it report sooner. Those counters are read this long after a phase.
STATS_FLUSH_S = 11.0
TOP = 12  # statements shown per phase

SETUP_SQL = (
    "CREATE EXTENSION IF NOT EXISTS pg_stat_statements",
    "CREATE EXTENSION IF NOT EXISTS pg_walinspect",
    # This connection's reads are the measurement's, not the engine's.
    "SET pg_stat_statements.track = 'none'",
)
STATEMENTS_SQL = """
SELECT queryid, calls, total_exec_time, rows, query FROM pg_stat_statements
WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
"""
TABLES_SQL = (
    "SELECT relname, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del FROM pg_stat_user_tables"
)
STAT_WAL_SQL = "SELECT wal_write, wal_sync FROM pg_stat_wal"
LSN_SQL = "SELECT pg_current_wal_insert_lsn()::text"
WAL_BYTES_SQL = "SELECT pg_wal_lsn_diff(%s::pg_lsn, %s::pg_lsn)::bigint"
FLUSHED_SQL = "SELECT pg_current_wal_flush_lsn() >= %s::pg_lsn"
WAL_TYPES_SQL = """
SELECT "resource_manager/record_type", count, record_size, fpi_size
FROM pg_get_wal_stats(%s::pg_lsn, %s::pg_lsn, true) WHERE count > 0
"""
PROCESSES_SQL = "SELECT pid, backend_type FROM pg_stat_activity"
RUNS_LEFT_SQL = "SELECT count(*) FROM runs_run WHERE id = ANY(%s) AND status <> ALL(%s)"


# --------------------------------------------------------------------------- CPU
def kind_of(backend_type: str) -> str:
    if backend_type == "client backend":
        return "backends"
    if backend_type.startswith("autovacuum"):
        return "autovacuum"
    return "background"  # the postmaster, walwriter, checkpointer, background writer...


@dataclass
class Cpu:
    """CPU seconds by owner at one moment. ``postgres``: each live process of the server
    by (pid, start time), with its kind; ``reaped``: the server's processes that ended,
    all their time (the postmaster's children's, /proc/<pid>/stat's cutime and cstime)."""

    postgres: dict[tuple[int, int], tuple[str, float]]
    reaped: float
    worker: float
    driver: float
    redis: float

    def since(self, before: Cpu, skip: int) -> dict[str, float]:
        """Seconds spent from ``before`` to this moment, by owner; PostgreSQL's by kind
        (``exited``: processes that ended meanwhile), leaving out the backend ``skip``."""
        spent: dict[str, float] = defaultdict(float)
        for key, (kind, seconds) in self.postgres.items():
            if key[0] != skip:
                spent[kind] += seconds - before.postgres.get(key, (kind, 0.0))[1]
        # A process that ended inside the phase: its time since the phase began is the
        # reaped time's growth less what it had used before.
        spent["exited"] = self.reaped - before.reaped
        for key, (_kind, seconds) in before.postgres.items():
            if key not in self.postgres and key[0] != skip:
                spent["exited"] -= seconds
        spent["postgres"] = sum(spent.values())
        spent.update(
            worker=self.worker - before.worker,
            driver=self.driver - before.driver,
            redis=self.redis - before.redis,
        )
        return dict(spent)


# --------------------------------------------------------------------------- the server
class Monitor:
    """The measurement's own connection to PostgreSQL (autocommit, untracked)."""

    def __init__(self, url: str) -> None:
        import psycopg

        self.connection: psycopg.Connection[tuple[Any, ...]] = psycopg.connect(url, autocommit=True)
        for statement in SETUP_SQL:
            self.run(statement)
        self.pid = self.one("SELECT pg_backend_pid()")
        parent = Path(f"/proc/{self.pid}/stat")
        if not parent.exists():
            raise SystemExit(
                "PostgreSQL must run on this host: its processes' CPU is read from /proc"
            )
        self.postmaster = parent_of(self.pid)

    def one(self, sql: str, *params: Any) -> Any:
        row = self.connection.execute(sql, params or None).fetchone()
        return row[0] if row else None

    def run(self, sql: str) -> None:
        self.connection.execute(sql)

    def rows(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        return self.connection.execute(sql, params or None).fetchall()

    def postgres_cpu(self) -> tuple[dict[tuple[int, int], tuple[str, float]], float]:
        """The server's live processes' CPU seconds, by (pid, start time), with their
        kind; and the reaped time of those that ended (Cpu)."""
        kinds = {pid: kind_of(kind or "") for pid, kind in self.rows(PROCESSES_SQL)}
        found: dict[tuple[int, int], tuple[str, float]] = {}
        reaped = 0.0
        for pid in (self.postmaster, *descendants(self.postmaster)):
            entry = proc_seconds(pid)
            if entry:
                found[(pid, entry[0])] = (kinds.get(pid, "background"), entry[1])
                reaped += entry[2]
        return found, reaped

    def statements(self) -> dict[int, tuple[int, float, int, str]]:
        """By query id: calls, execution milliseconds, rows, the normalised text."""
        return {
            queryid: (calls, total, rows, " ".join(query.split()))
            for queryid, calls, total, rows, query in self.rows(STATEMENTS_SQL)
        }

    def counters(self) -> Counters:
        """The counters a backend reports late (STATS_FLUSH_S): read that long after."""
        tables = {
            name: (ins, upd, hot, dele) for name, ins, upd, hot, dele in self.rows(TABLES_SQL)
        }
        return Counters(tables, tuple(int(value) for value in self.rows(STAT_WAL_SQL)[0]))

    def wal_types(self, start: str, end: str) -> dict[str, tuple[int, int, int]]:
        """WAL from ``start`` to ``end`` by record type: records, bytes, of which
        full-page images. Read once the server has flushed up to ``end``."""
        while not self.one(FLUSHED_SQL, end):
            time.sleep(POLL_S)  # the WAL writer flushes every 200 ms
        if start == end:
            return {}
        return {
            kind: (count, record + fpi, fpi)
            for kind, count, record, fpi in self.rows(WAL_TYPES_SQL, start, end)
        }


@dataclass(frozen=True)
class Counters:
    """Rows inserted, updated, HOT-updated and deleted by table, and pg_stat_wal's
    writes and flushes, since the server began."""

    tables: dict[str, tuple[int, int, int, int]]
    wal: tuple[int, ...]

    def since(self, before: Counters) -> tuple[dict[str, dict[str, int]], dict[str, int]]:
        """Rows written by table (tables with none left out) and WAL, from ``before``."""
        tables = {}
        for name, counts in self.tables.items():
            then = before.tables.get(name, (0, 0, 0, 0))
            ins, upd, hot, dele = (now - old for now, old in zip(counts, then, strict=True))
            if ins or upd or dele:
                tables[name] = {"inserted": ins, "updated": upd, "hot": hot, "deleted": dele}
        wal = [now - old for now, old in zip(self.wal, before.wal, strict=True)]
        return tables, dict(zip(("writes", "flushes"), wal, strict=True))


# --------------------------------------------------------------------------- phases
@dataclass(frozen=True)
class Phase:
    name: str
    what: str
    unit: str  # "step" or "run": what the figures are per
    plans: list[dict[str, Any]]
    steps: int

    @property
    def units(self) -> int:
        return self.steps if self.unit == "step" else len(self.plans)


def phases(fan: int, seq: int, runs: int) -> list[Phase]:
    from .plans import fan_plan, sequential_plan

    return [
        Phase(
            "fan", f"one run of {fan} parallel steps and a join", "step", [fan_plan(fan)], fan + 1
        ),
        Phase("seq", f"one run of {seq} sequential steps", "step", [sequential_plan(seq)], seq),
        Phase(
            "small",
            f"{runs} runs of {SMALL_STEPS} sequential steps, started one after another",
            "run",
            [sequential_plan(SMALL_STEPS) for _ in range(runs)],
            runs * SMALL_STEPS,
        ),
    ]


@dataclass
class Measured:
    """One phase's figures, totals over the phase (``per`` divides by its units)."""

    phase: Phase
    wall_s: float
    cpu_s: dict[str, float]
    statements: list[dict[str, Any]]
    tables: dict[str, dict[str, int]]
    wal_bytes: int
    stat_wal: dict[str, int]
    wal_types: dict[str, tuple[int, int, int]]

    def per(self, value: float) -> float:
        return value / self.phase.units

    @property
    def wal_records(self) -> int:
        return sum(count for count, _size, _fpi in self.wal_types.values())

    @property
    def page_bytes(self) -> int:
        """Of the WAL, the full-page images' bytes (from a checkpoint just before)."""
        return sum(fpi for _count, _size, fpi in self.wal_types.values())

    @property
    def postgres_ms(self) -> float:
        """PostgreSQL's CPU per unit, milliseconds: what a primary's cores are spent on."""
        return self.per(self.cpu_s["postgres"]) * 1000

    def as_dict(self) -> dict[str, Any]:
        return {
            "what": self.phase.what,
            "unit": self.phase.unit,
            "units": self.phase.units,
            "steps": self.phase.steps,
            "wall_s": self.wall_s,
            "cpu_s": self.cpu_s,
            "statements": self.statements,
            "tables": self.tables,
            "wal_bytes": self.wal_bytes,
            "stat_wal": self.stat_wal,
            "wal_types": {
                kind: {"records": count, "bytes": size, "fpi_bytes": fpi}
                for kind, (count, size, fpi) in self.wal_types.items()
            },
            "per_unit": {
                "postgres_cpu_ms": self.postgres_ms,
                "statements": self.per(sum(s["calls"] for s in self.statements)),
                "statement_ms": self.per(sum(s["total_ms"] for s in self.statements)),
                "rows_written": self.per(
                    sum(t["inserted"] + t["updated"] + t["deleted"] for t in self.tables.values())
                ),
                "wal_bytes": self.per(self.wal_bytes),
                "wal_bytes_without_pages": self.per(self.wal_bytes - self.page_bytes),
                "wal_records": self.per(self.wal_records),
            },
            "ceiling": {str(cores): ceiling(self, cores) for cores in CORES},
        }


def ceiling(measured: Measured, cores: int) -> dict[str, float]:
    """Units a second a primary of ``cores`` carries when every core does nothing but
    this work at the measured cost (an upper bound), and the WAL it then writes: without
    full-page images (a long checkpoint interval) and with them (every page cold)."""
    per_s = cores * 1000 / measured.postgres_ms if measured.postgres_ms else 0.0
    return {
        "per_s": per_s,
        "wal_mb_per_s_least": per_s * measured.per(measured.wal_bytes - measured.page_bytes) / 1e6,
        "wal_mb_per_s_most": per_s * measured.per(measured.wal_bytes) / 1e6,
    }


class Driver:
    """Creates and starts the runs of a phase for one organization, and waits for them
    through the monitor's connection."""

    def __init__(self, monitor: Monitor, alive: Callable[[], bool], timeout: float) -> None:
        from billing.services import credits_grant, organization_create

        self.monitor, self.alive, self.timeout = monitor, alive, timeout
        self.organization = organization_create(name=f"capacity-{uuid.uuid4().hex[:8]}")
        credits_grant(organization=self.organization, amount=10_000_000, reason="capacity")

    def play(self, phase: Phase) -> float:
        """Create and start the phase's runs, wait for them to end: the wall seconds."""
        from runs import services
        from runs.engine.start import run_start
        from runs.states import RUN_TERMINAL

        started = time.perf_counter()
        ids = []
        for plan in phase.plans:
            run = services.run_create(organization=self.organization, plan=plan, actor="capacity")
            run_start(run_id=run.pk, actor="capacity")
            ids.append(run.pk)
        terminal = [str(status) for status in RUN_TERMINAL]
        while left := self.monitor.one(RUNS_LEFT_SQL, ids, terminal):
            if time.perf_counter() - started > self.timeout:
                raise WorkerFailed(f"{phase.name}: {left} of {len(ids)} runs still open")
            if not self.alive():
                raise WorkerFailed(f"{phase.name}: the worker died")
            time.sleep(POLL_S)
        wall = time.perf_counter() - started
        self._check(phase, ids)
        return wall

    @staticmethod
    def _check(phase: Phase, ids: list[Any]) -> None:
        from runs.models import Run, Step
        from runs.states import RunStatus, StepStatus

        completed = Run.objects.filter(pk__in=ids, status=RunStatus.COMPLETED).count()
        steps = Step.objects.filter(run_id__in=ids, status=StepStatus.COMPLETED).count()
        if completed != len(ids) or steps != phase.steps:
            raise WorkerFailed(
                f"{phase.name}: {completed} of {len(ids)} runs and {steps} of "
                f"{phase.steps} steps completed"
            )


def measure(
    phase: Phase, driver: Driver, monitor: Monitor, worker: Worker, broker: str, since: Counters
) -> tuple[Measured, Counters]:
    """The phase between two readings; ``since``: the counters read STATS_FLUSH_S after
    the previous phase (or the warm-up), which this one's are read as long after."""

    def cpu() -> Cpu:
        own = os.times()
        return Cpu(
            *monitor.postgres_cpu(),
            tree_seconds(worker.pid),
            own.user + own.system,
            redis_seconds(broker),
        )

    # Every page's first change after a checkpoint writes the whole page to the WAL: from
    # one just before, the phase's full-page images are those of a server whose pages
    # all go into the phase cold (the most), and its WAL without them the least.
    monitor.run("CHECKPOINT")
    monitor.one("SELECT pg_stat_statements_reset()")
    lsn_before, cpu_before = monitor.one(LSN_SQL), cpu()
    wall = driver.play(phase)
    time.sleep(SETTLE_S)
    lsn_after, cpu_after = monitor.one(LSN_SQL), cpu()
    statements = sorted(monitor.statements().values(), key=lambda found: -found[1])
    time.sleep(STATS_FLUSH_S)
    counters = monitor.counters()
    tables, wal = counters.since(since)
    measured = Measured(
        phase=phase,
        wall_s=wall,
        cpu_s=cpu_after.since(cpu_before, skip=monitor.pid),
        statements=[
            {"calls": calls, "total_ms": total, "rows": rows, "query": query}
            for calls, total, rows, query in statements
        ],
        tables=tables,
        wal_bytes=int(monitor.one(WAL_BYTES_SQL, lsn_after, lsn_before)),
        stat_wal=wal,
        wal_types=monitor.wal_types(lsn_before, lsn_after),
    )
    return measured, counters


# --------------------------------------------------------------------------- report
def report(results: list[Measured]) -> str:
    lines = []
    for result in results:
        lines += ["", *_phase_lines(result)]
    lines += ["", "One primary's ceiling, every core on this work at the cost measured:"]
    for result in results:
        unit, ms = result.phase.unit, result.postgres_ms
        bounds = []
        for cores in CORES:
            bound = ceiling(result, cores)
            bounds.append(
                f"{cores} x 1000 / {ms:.2f} = {bound['per_s']:,.0f} {unit}s/s "
                f"(WAL {bound['wal_mb_per_s_least']:.0f} - {bound['wal_mb_per_s_most']:.0f} MB/s)"
            )
        lines.append(f"  {result.phase.name}: {'; '.join(bounds)}")
    return "\n".join(lines)


def _phase_lines(result: Measured) -> list[str]:
    phase, per, unit = result.phase, result.per, result.phase.unit

    def ms(owner: str) -> str:
        return f"{per(result.cpu_s.get(owner, 0.0)) * 1000:.2f}"

    calls = sum(s["calls"] for s in result.statements)
    spent = sum(s["total_ms"] for s in result.statements)
    written = sum(t["inserted"] + t["updated"] + t["deleted"] for t in result.tables.values())
    lines = [
        f"{phase.name}: {phase.what}: {phase.units} {unit}s, {result.wall_s:.2f} s wall "
        f"({phase.units / result.wall_s:.0f} {unit}s/s on this machine)",
        f"  PostgreSQL CPU per {unit}: {result.postgres_ms:.2f} ms (backends {ms('backends')}, "
        f"autovacuum {ms('autovacuum')}, background {ms('background')}, ended {ms('exited')}); "
        f"worker {ms('worker')} ms, driver {ms('driver')} ms, Redis {ms('redis')} ms",
        f"  WAL per {unit}: {per(result.wal_bytes):,.0f} bytes after a checkpoint, "
        f"{per(result.wal_bytes - result.page_bytes):,.0f} without its full-page images; "
        f"{per(result.wal_records):.1f} records; {per(result.stat_wal['flushes']):.2f} flushes",
        f"  statements per {unit}: {per(calls):.1f}, executing {per(spent):.3f} ms; "
        f"the {TOP} costliest:",
        f"    {'calls':>7} {'ms':>7} {'mean ms':>8} {'rows':>6}  statement (per {unit})",
    ]
    for s in result.statements[:TOP]:
        lines.append(
            f"    {per(s['calls']):7.2f} {per(s['total_ms']):7.3f} "
            f"{s['total_ms'] / s['calls']:8.3f} {per(s['rows']):6.2f}  {s['query'][:90]}"
        )
    lines += [
        f"  rows written per {unit}: {per(written):.1f}",
        f"    {'inserted':>8} {'updated':>8} {'HOT':>6} {'deleted':>8}  table",
    ]
    for name, t in sorted(result.tables.items(), key=lambda item: -sum(item[1].values())):
        lines.append(
            f"    {per(t['inserted']):8.2f} {per(t['updated']):8.2f} {per(t['hot']):6.2f} "
            f"{per(t['deleted']):8.2f}  {name}"
        )
    lines += [
        f"  WAL by record type per {unit}, the largest (pages: of it full-page images):",
        f"    {'records':>8} {'bytes':>8} {'pages':>8}  type",
    ]
    largest = sorted(result.wal_types.items(), key=lambda item: -item[1][1])[:8]
    for kind, (count, size, fpi) in largest:
        lines.append(f"    {per(count):8.2f} {per(size):8.0f} {per(fpi):8.0f}  {kind}")
    return lines


# --------------------------------------------------------------------------- main
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.capacity", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--fan", type=int, default=1000, help="parallel steps of the fan phase")
    parser.add_argument("--seq", type=int, default=500, help="steps of the sequential phase")
    parser.add_argument(
        "--runs", type=int, default=200, help=f"runs of {SMALL_STEPS} steps of the small phase"
    )
    parser.add_argument("--workers", type=int, default=2, help="the worker's prefork children")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds a phase may take")
    parser.add_argument("--json", default=os.environ.get("CAPACITY_JSON", ""), help="CAPACITY_JSON")
    args = parser.parse_args(argv)
    if min(args.fan, args.seq, args.runs, args.workers) < 1:
        parser.error("--fan, --seq, --runs and --workers must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.local")
    # Stopped: the worker is stopped too (the finally below), as on Ctrl-C.
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    import django

    django.setup()
    from django.conf import settings

    url, broker = os.environ["DATABASE_URL"], settings.CELERY_BROKER_URL
    monitor = Monitor(url)
    workdir = Path(os.environ.get("BENCH_DIR") or tempfile.mkdtemp(prefix="capacity-"))
    worker = Worker(args.workers, workdir / "worker.log")
    measured: list[Measured] = []
    load = os.getloadavg()[0]
    try:
        print(f"==> starting a worker: prefork, {args.workers} children", file=sys.stderr)
        worker.start()
        driver = Driver(monitor, worker.alive, args.timeout)
        print("==> warming up, then waiting for the statistics", file=sys.stderr)
        for phase in phases(min(args.fan, 50), min(args.seq, 20), min(args.runs, 10)):
            driver.play(phase)
        monitor.run("ANALYZE")  # statistics as a running server's (bench.run.analyze)
        time.sleep(STATS_FLUSH_S)
        counters = monitor.counters()
        for phase in phases(args.fan, args.seq, args.runs):
            print(f"==> {phase.name}: {phase.what}", file=sys.stderr)
            result, counters = measure(phase, driver, monitor, worker, broker, counters)
            measured.append(result)
    except WorkerFailed as problem:
        print(
            f"capacity: {problem}; worker log {worker.log_path}:\n{worker.log_tail()}",
            file=sys.stderr,
        )
        return 1
    finally:
        worker.stop()
    version = monitor.one("SHOW server_version")
    header = (
        f"PostgreSQL {version}'s cost of a step and of a small run: {os.cpu_count()} CPUs "
        f"(1-min load {load:.1f} before, {os.getloadavg()[0]:.1f} after), "
        f"1 worker of {args.workers} children, fsync {monitor.one('SHOW fsync')}, "
        f"synchronous_commit {monitor.one('SHOW synchronous_commit')}, "
        f"full_page_writes {monitor.one('SHOW full_page_writes')}"
    )
    print(header)
    print(report(measured))
    if args.json:
        document = {
            "header": header,
            "config": vars(args) | {"cpus": os.cpu_count(), "postgres": version},
            "phases": {result.phase.name: result.as_dict() for result in measured},
        }
        Path(args.json).write_text(json.dumps(document, indent=2) + "\n")
        print(f"\nJSON written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
