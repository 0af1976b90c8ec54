"""`python -m bench.scale` (`scripts/bench.sh scale`): one run over fleets of several sizes.

For each fleet of SCALE_SET (``"1x4 2x4 4x4 8x4 12x4"``: worker processes x prefork
children), it starts that many separate ``celery worker`` processes, each with its own
hostname, as separate hosts would run them, all consuming the engine's queues and the
raw baselines' on the same broker; warms them up; then measures, engine beside raw
Celery on the same fleet:

- ``fan_sleep`` / ``group_sleep``: 2,000 steps (tasks) of 50 ms, the engine's with a
  join; efficiency = the ideal wall (2,000 x 50 ms / the fleet's children) / the
  measured one;
- ``fan_2000`` / ``group_2000``: the same width of no-op steps (tasks);
- ``many_runs`` / ``many_chains``: 500 runs (chains) of 5 no-op steps, one
  organization's, submitted by BENCH_CLIENTS client processes (default 8,
  ``bench.clients``); runs/s and p95 completion latency.

It prints one table, one row per fleet, and with ``--json`` (or SCALE_JSON) writes every
figure. Figures are reported, never asserted. On a machine with fewer cores than the
fleet has children, the fleet competes for the same CPUs with PostgreSQL and Redis: the
table says how many CPUs measured it.

Expects migrated PostgreSQL and Redis at DATABASE_URL and CELERY_BROKER_URL:
``scripts/bench.sh scale`` starts throwaway ones.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .clients import Clients
from .report import ratio
from .worker import Worker, WorkerFailed

if TYPE_CHECKING:
    from .scenarios import Engine, Raw, Sample

DEFAULT_SET = "1x4 2x4 4x4 8x4 12x4"
# What the many-runs scenarios report (bench.scenarios._many_extra), in the JSON; the
# table shows runs/s and p95 completion latency.
MANY_EXTRAS = (
    "runs_per_s",
    "p50_start_s",
    "p95_start_s",
    "p50_latency_s",
    "p95_latency_s",
    "cpu_ms_total",
    "cpu_ms_postgres",
    "cpu_busy",
)


@dataclass(frozen=True)
class Fleet:
    processes: int
    children: int

    @property
    def slots(self) -> int:
        return self.processes * self.children

    @property
    def label(self) -> str:
        return f"{self.processes}x{self.children}"


def parse_set(text: str) -> list[Fleet]:
    """``"1x4 2x4"`` -> fleets; refuses anything else with a message naming it."""
    fleets = []
    for item in text.replace(",", " ").split():
        processes, _, children = item.lower().partition("x")
        if not (processes.isdigit() and children.isdigit()) or "0" in (processes, children):
            raise ValueError(f"{item!r} is not processes x children, such as 4x4")
        fleets.append(Fleet(int(processes), int(children)))
    if not fleets:
        raise ValueError("no fleet given")
    return fleets


@dataclass
class Row:
    fleet: Fleet
    figures: dict[str, float | None] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)

    def take(self, name: str, sample: Sample, *extras: str) -> None:
        if sample.error is not None or sample.wall_s is None:
            self.errors[name] = sample.error or "no figure"
            self.figures[f"{name}_wall_s"] = None
            return
        self.figures[f"{name}_wall_s"] = sample.wall_s
        for extra in extras:
            self.figures[f"{name}_{extra}"] = sample.extra.get(extra)


def measure(fleet: Fleet, timeout: float, workdir: Path, clients: Clients) -> Row:
    from .plans import fan_plan
    from .run import analyze, cpu_meter, warm_up
    from .scenarios import Engine, Raw

    workers = [
        Worker(fleet.children, workdir / f"worker-{fleet.label}-{index}.log")
        for index in range(fleet.processes)
    ]
    row = Row(fleet)
    try:
        for worker in workers:
            worker.start()

        def alive() -> bool:
            return all(worker.alive() for worker in workers)

        meter = cpu_meter(lambda: [worker.pid for worker in workers], clients)
        engine: Engine = Engine(timeout, alive, fleet.slots, clients=clients, meter=meter)
        raw: Raw = Raw(timeout, alive, fleet.slots, clients=clients, meter=meter)
        for problem in warm_up(engine, raw, fleet.slots):
            _say(f"    warm-up failed: {problem}")
        time.sleep(1)
        scenarios: list[tuple[str, Callable[[], Sample], tuple[str, ...]]] = [
            ("fan_sleep", engine.fan_sleep, ("efficiency",)),
            ("group_sleep", raw.group_sleep, ("efficiency",)),
            ("fan_2000", lambda: engine.run(fan_plan(2000), 2001), ()),
            ("group_2000", lambda: raw.group(2000), ()),
            ("many_runs", engine.many_runs, MANY_EXTRAS),
            ("many_chains", raw.many_chains, MANY_EXTRAS),
        ]
        for name, scenario, extras in scenarios:
            analyze()
            sample = scenario()
            row.take(name, sample, *extras)
            shown = sample.error or f"{sample.wall_s:.3f} s"
            _say(f"    {fleet.label:>6} {name:<12} {shown}")
            time.sleep(0.5)
    except WorkerFailed as exc:
        row.errors["fleet"] = str(exc)
    finally:
        for worker in workers:
            worker.stop()
    return row


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else fmt.format(value)


def _cpu(figures: dict[str, float | None], name: str) -> str:
    """A many-runs scenario's CPU per run, all of it and (when any) PostgreSQL's."""
    total, postgres = figures.get(f"{name}_cpu_ms_total"), figures.get(f"{name}_cpu_ms_postgres")
    if total is None:
        return "-"
    return f"{total:.1f} ({postgres:.1f})" if postgres else f"{total:.1f}"


HEADER = (
    "fleet",
    "slots",
    "fan_sleep s",
    "eff",
    "group_sleep s",
    "eff",
    "fan_2000 s",
    "group_2000 s",
    "fan/group",
    "many_runs/s",
    "p95 s",
    "CPU ms/run (pg)",
    "many_chains/s",
    "p95 s",
    "CPU ms/run",
    "runs ratio",
)


def table(rows: list[Row]) -> str:
    lines = [list(HEADER)]
    for row in rows:
        f = row.figures
        lines.append(
            [
                row.fleet.label,
                str(row.fleet.slots),
                _num(f.get("fan_sleep_wall_s"), "{:.2f}"),
                _num(f.get("fan_sleep_efficiency"), "{:.2f}"),
                _num(f.get("group_sleep_wall_s"), "{:.2f}"),
                _num(f.get("group_sleep_efficiency"), "{:.2f}"),
                _num(f.get("fan_2000_wall_s"), "{:.2f}"),
                _num(f.get("group_2000_wall_s"), "{:.2f}"),
                _num(ratio(f.get("fan_2000_wall_s"), f.get("group_2000_wall_s")), "{:.2f}x"),
                _num(f.get("many_runs_runs_per_s"), "{:.1f}"),
                _num(f.get("many_runs_p95_latency_s"), "{:.2f}"),
                _cpu(f, "many_runs"),
                _num(f.get("many_chains_runs_per_s"), "{:.1f}"),
                _num(f.get("many_chains_p95_latency_s"), "{:.2f}"),
                _cpu(f, "many_chains"),
                _num(
                    ratio(f.get("many_runs_runs_per_s"), f.get("many_chains_runs_per_s")),
                    "{:.2f}x",
                ),
            ]
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(HEADER))]
    rendered = ["  ".join(cell.rjust(widths[i]) for i, cell in enumerate(line)) for line in lines]
    rendered.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(rendered)


NOTES = (
    "fleet = worker processes x prefork children, each process a `celery worker` of its own "
    "hostname; slots = processes x children.",
    "eff (efficiency) = ideal wall (2,000 x 50 ms / slots) / measured wall; fan_sleep has a "
    "join step after its 2,000 sleeps, group_sleep is a bare group.",
    "fan/group: fan_2000 wall / group_2000 wall (no-op steps; <= 1.0 means the engine is "
    "as fast). runs ratio: many_runs runs/s / many_chains runs/s.",
    "CPU ms/run: the CPU of every process of the measurement (PostgreSQL, the workers, the "
    "clients, Redis, this one) from the clock's start to the wall's end, per run; in "
    "brackets, PostgreSQL's.",
)


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.scale", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--set", default=os.environ.get("SCALE_SET", DEFAULT_SET))
    parser.add_argument(
        "--timeout", type=float, default=float(os.environ.get("BENCH_TIMEOUT", 600))
    )
    parser.add_argument("--json", default=os.environ.get("SCALE_JSON", ""))
    parser.add_argument("--dir", default=os.environ.get("BENCH_DIR", ""))
    parser.add_argument("--clients", type=int, default=int(os.environ.get("BENCH_CLIENTS", 8)))
    args = parser.parse_args(argv)
    if args.clients < 1:
        parser.error("--clients must be at least 1")
    try:
        fleets = parse_set(args.set)
    except ValueError as exc:
        parser.error(f"SCALE_SET: {exc}")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.local")
    import django

    django.setup()
    workdir = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="bench-scale-"))
    load_before = os.getloadavg()[0]
    rows = []
    with Clients(args.clients) as clients:
        for fleet in fleets:
            _say(
                f"==> fleet {fleet.label}: {fleet.processes} worker process(es) of {fleet.children}"
            )
            rows.append(measure(fleet, args.timeout, workdir, clients))
    header = (
        f"One run over the fleet: {len(fleets)} fleet(s), {args.clients} clients submitting "
        f"many_runs and many_chains, {os.cpu_count()} CPUs, 1-min load "
        f"average {load_before:.2f} before, {os.getloadavg()[0]:.2f} after"
    )
    print(f"\n{header}\n\n{table(rows)}\n")
    for note in NOTES:
        print(f"  {note}")
    for row in rows:
        for name, error in row.errors.items():
            print(f"  {row.fleet.label} {name} failed: {error}")
    if args.json:
        report: dict[str, Any] = {
            "cpus": os.cpu_count(),
            "set": args.set,
            "clients": args.clients,
            "rows": [
                {
                    "fleet": row.fleet.label,
                    "slots": row.fleet.slots,
                    **row.figures,
                    "errors": row.errors,
                }
                for row in rows
            ],
        }
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
        print(f"\nJSON written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
