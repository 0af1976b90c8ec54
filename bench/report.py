"""Figures, the side-by-side table, the goals and the JSON report."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

LATENCY = ("start_latency", "start_latency_raw")
# Further figures a scenario may report (Sample.extra): how each reads, in this order.
EXTRAS = {
    "runs_per_s": ("runs/s", "{:.1f}"),
    "submit_s": ("all submitted in", "{:.2f} s"),
    "p50_start_s": ("start p50", "{:.4f} s"),
    "p95_start_s": ("p95", "{:.4f} s"),
    "p50_latency_s": ("completion p50", "{:.3f} s"),
    "p95_latency_s": ("p95", "{:.3f} s"),
    "b_idle_s": ("B alone", "{:.3f} s"),
    "b_beside_s": ("B beside A", "{:.3f} s"),
    "b_worst_s": ("worst", "{:.3f} s"),
    "b_ratio": ("B ratio", "{:.2f}x"),
    "a_alone_s": ("A alone", "{:.1f} s"),
    "a_ratio": ("A beside B / alone", "{:.3f}x"),
    "efficiency": ("efficiency", "{:.2f}"),
    # Jobs served on a host (bench.runner_jobs).
    "jobs_per_s": ("jobs/s", "{:.1f}"),
    "p50_claim_to_report_ms": ("claim to report p50", "{:.1f} ms"),
    "p95_claim_to_report_ms": ("p95", "{:.1f} ms"),
    "p50_park_ms": ("the fleet's park p50", "{:.1f} ms"),
    # The many-runs scenarios' CPU per run, by owner (bench.procs.CpuMeter); the jobs
    # scenarios' per job.
    "cpu_ms_total": ("CPU per run", "{:.1f} ms"),
    "cpu_ms_postgres": ("PostgreSQL", "{:.1f}"),
    "cpu_ms_worker": ("worker", "{:.1f}"),
    "cpu_ms_clients": ("clients", "{:.1f}"),
    "cpu_ms_web": ("gunicorn", "{:.1f}"),
    "cpu_ms_redis": ("Redis", "{:.1f}"),
    "cpu_ms_bench": ("bench", "{:.1f}"),
    "cpu_ms_host": ("host", "{:.1f}"),
    "cpu_busy": ("cores busy", "{:.0%}"),
}
# Scenarios whose worker memory over the scenario itself is shown under the table (the
# JSON has it for every scenario).
MEMORY_SHOWN = ("fan_20000", "group_20000")


@dataclass
class Figure:
    """Every repetition of one scenario; the reported figure is their median."""

    name: str
    kind: str  # "engine" or "raw"
    steps: int
    walls: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    # Sample.extra of the successful repetitions, by name.
    extras: dict[str, list[float]] = field(default_factory=dict)
    # Worker RSS (KiB, the worker and its children) just before and just after each
    # repetition, failed ones included.
    rss_kib: list[tuple[int, int]] = field(default_factory=list)

    @property
    def runs(self) -> int:
        return len(self.walls) + len(self.errors)

    @property
    def failed(self) -> bool:
        return bool(self.errors) or not self.walls

    @property
    def error(self) -> str | None:
        if not self.errors:
            return None if self.walls else "not run"
        suffix = f" ({len(self.errors)} of {self.runs} runs)" if self.runs > 1 else ""
        return f"{self.errors[0]}{suffix}"

    @property
    def wall_s(self) -> float | None:
        return None if self.failed else statistics.median(self.walls)

    @property
    def ms_per_step(self) -> float | None:
        wall = self.wall_s
        return None if wall is None else wall * 1000 / self.steps

    @property
    def steps_per_s(self) -> float | None:
        wall = self.wall_s
        return None if not wall else self.steps / wall

    def add_extra(self, values: dict[str, float]) -> None:
        for key, value in values.items():
            self.extras.setdefault(key, []).append(value)

    def extra_median(self, key: str) -> float | None:
        """The median of a further figure; None if the scenario failed or has none."""
        values = self.extras.get(key)
        return None if self.failed or not values else statistics.median(values)

    @property
    def rss_growth(self) -> float | None:
        """Median growth of the worker's RSS over one repetition (0.05: +5%)."""
        growths = [after / before - 1 for before, after in self.rss_kib if before and after]
        return statistics.median(growths) if growths else None

    def rss_median(self, index: int) -> int | None:
        values = [pair[index] for pair in self.rss_kib if pair[0] and pair[1]]
        return int(statistics.median(values)) if values else None

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "steps": self.steps,
            "runs": self.runs,
            "wall_s": self.wall_s,
            "ms_per_step": self.ms_per_step,
            "steps_per_s": self.steps_per_s,
            "walls_s": self.walls,
            "error": self.error,
            "extra": {key: self.extra_median(key) for key in self.extras},
            "extras_all": self.extras,
            "worker_rss_kib": [{"before": b, "after": a} for b, a in self.rss_kib],
            "worker_rss_growth": self.rss_growth,
        }


@dataclass(frozen=True)
class Row:
    scenario: str
    raw: str
    label: str  # how the raw column names what it compares with


ROWS = (
    Row("seq_100", "chain_100", "chain_100"),
    Row("seq_1000", "chain_1000", "chain_1000"),
    Row("fan_2000", "group_2000", "group_2000"),
    Row("fan_2000", "chord_2000", "chord_2000 (+join)"),
    Row("fan_2000_tool", "fan_2000", "engine fan_2000"),
    Row("dag_1000", "fan_2000", "engine fan_2000"),
    Row("start_latency", "start_latency_raw", "apply_async->start"),
    Row("many_runs", "many_chains", "many_chains (500x5)"),
    Row("many_runs_orgs", "many_chains", "many_chains (500x5)"),
    Row("many_runs_api", "many_chains", "many_chains (500x5)"),
    Row("many_runs_api", "many_runs", "engine many_runs"),
    Row("fan_20000", "group_20000", "group_20000"),
    Row("fan_20000", "fan_2000", "engine fan_2000"),
    Row("fan_sleep", "group_sleep", "group_sleep"),
    Row("fan_2000_wide", "group_2000_wide", "group_2000_wide"),
    Row("fan_2000_wide", "fan_2000", "engine fan_2000"),
)

HEADER = (
    "scenario",
    "engine wall s",
    "engine ms/step",
    "engine steps/s",
    "raw variant",
    "raw wall s",
    "raw ms/step",
    "raw steps/s",
    "ratio",
)


def _num(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _short(text: str, width: int = 36) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def _cells(figure: Figure | None) -> list[str]:
    if figure is None:
        return ["not run", "-", "-"]
    if figure.failed:
        return [_short(f"failed: {figure.error or ''}"), "-", "-"]
    if figure.name in LATENCY:
        return [_num(figure.wall_s, 4), _num(figure.ms_per_step, 2), "-"]
    return [
        _num(figure.wall_s, 3),
        _num(figure.ms_per_step, 3),
        _num(figure.steps_per_s, 0),
    ]


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def table_rows(figures: dict[str, Figure]) -> list[dict[str, Any]]:
    rows = []
    for row in ROWS:
        engine, raw = figures.get(row.scenario), figures.get(row.raw)
        if engine is None and raw is None:
            continue
        rows.append(
            {
                "scenario": row.scenario,
                "raw_variant": row.label,
                "raw_scenario": row.raw,
                "ratio": ratio(
                    engine.ms_per_step if engine else None, raw.ms_per_step if raw else None
                ),
                "cells": [row.scenario, *_cells(engine), row.label, *_cells(raw)],
            }
        )
    return rows


def format_table(figures: dict[str, Figure]) -> str:
    lines = [list(HEADER)]
    for row in table_rows(figures):
        lines.append([*row["cells"], "-" if row["ratio"] is None else f"{row['ratio']:.2f}x"])
    widths = [max(len(line[i]) for line in lines) for i in range(len(HEADER))]
    numeric = {1, 2, 3, 5, 6, 7, 8}

    def fmt(line: list[str]) -> str:
        return "  ".join(
            cell.rjust(widths[i]) if i in numeric else cell.ljust(widths[i])
            for i, cell in enumerate(line)
        ).rstrip()

    rule = "  ".join("-" * width for width in widths)
    return "\n".join([fmt(lines[0]), rule, *(fmt(line) for line in lines[1:])])


def format_extras(figures: dict[str, Figure]) -> list[str]:
    """One line per scenario with further figures (medians), or whose memory is shown."""
    width = max((len(name) for name in figures), default=0)
    lines = []
    for name, figure in figures.items():
        parts = []
        for key, (label, fmt) in EXTRAS.items():
            value = figure.extra_median(key)
            if value is not None:
                parts.append(f"{label} {fmt.format(value)}")
        growth = figure.rss_growth
        if name in MEMORY_SHOWN and growth is not None:
            parts.append(
                f"worker RSS {figure.rss_median(0)} -> {figure.rss_median(1)} KiB ({growth:+.1%})"
            )
        if parts:
            lines.append(f"  {name:<{width}}  {', '.join(parts)}")
    return lines


NOTES = (
    "ms/step = wall / steps; steps/s = steps / wall; ratio = engine ms/step / raw ms/step.",
    "fan_2000 counts its 2,000 parallel steps and the join step (2,001); chord_2000 counts "
    "2,000 header tasks and its body (2,001); group_2000 2,000 tasks.",
    "fan_2000_tool: fan_2000 with every step (the join too) of a no-op tool written with "
    "@tool and registered on the worker as a package's tools are (bench/fleet_tools.py), "
    "against the built-in noop; ratio = fan_2000_tool / fan_2000.",
    "dag_1000 row: 1,000 one-step tasks (seed 42, up to 3 random earlier dependencies each) "
    "compared per node with the engine's own fan_2000 per step; ratio = dag / fan.",
    "start latency: median of 10 one-step runs, run_start -> the step's started_at "
    "(PostgreSQL clock); raw: apply_async -> the task's own time.time() at start.",
    "Engine wall: run_start -> terminal status polled every 10 ms; raw wall: apply_async -> "
    "last result (Redis result backend).",
    "many_runs: 500 runs of 5 sequential no-op steps (2,500 steps) of one organization, all "
    "created first, then started by BENCH_CLIENTS client processes at once (run_start, each "
    "client its share in turn); wall from when all clients are ready until all 500 are "
    "terminal (one COUNT every 50 ms). many_runs_orgs: the same over 8 organizations. "
    "many_runs_api: the same runs created and started by the clients with POST /api/v1/runs "
    "{\"start\": true} against gunicorn (make load's); its many_runs row: the web tier's "
    "share. many_chains: 500 chains of 5 links, apply_async by the same clients; wall until "
    "the last result; raw Celery has no organizations, so it is the 8-organization rows' "
    "baseline too. Start latency = the call (run_start, POST, apply_async) until it "
    "returned; completion latency = the call until the run's completed_at (a chain: its "
    "last link's start, its own time.time()). CPU per run: the CPU time of each part "
    "(PostgreSQL's processes, the worker and its children, the client processes, gunicorn, "
    "Redis, the bench itself), read from /proc (Redis: INFO cpu) when the clock starts and "
    "when the wall ends, over the runs; cores busy: all of it over the wall time of every "
    "core (near 100%: the host's CPU is the bound).",
    "fan_20000: 20,000 steps, the most a run may have: 19,999 parallel no-op steps (four "
    "parallel tasks of at most 5,000, the per-task limit) then a join; fan_plan(20000) "
    "itself is refused by the plan limits. Its fan_2000 row: ratio = fan_20000 ms/step / "
    "fan_2000 ms/step. Worker RSS: just before -> just after the scenario.",
    "Wide fleet (fan_sleep, group_sleep, fan_2000_wide, group_2000_wide): a worker restarted "
    "with BENCH_WIDE_WORKERS children (default 32). fan_sleep: 2,000 parallel steps of the "
    "sleep tool (50 ms) and a join; group_sleep: a group of 2,000 tasks sleeping 50 ms; "
    "efficiency = ideal wall (2,000 x 50 ms / children) / measured wall. fan_2000_wide and "
    "group_2000_wide: fan_2000 and group_2000 on that worker; their fan_2000 row: ratio = "
    "fan_2000_wide per step / fan_2000 per step (the default worker's).",
    "runner_jobs: 400 no-op jobs of one run served by one orch worker (concurrency 8) and, "
    "as runner_jobs_reference, by the reference runner; claim to report = a job's "
    "completed_at - claimed_at; jobs/s over the first claim to the last report; the fleet's "
    "park = its claim of the step until the job's creation. CPU per run there is per job, "
    "host being the serving process.",
)


@dataclass(frozen=True)
class Goal:
    key: str
    text: str
    value: float | None
    shown: str  # how the value reads
    met: bool | None

    def as_dict(self) -> dict[str, Any]:
        return {"goal": self.text, "value": self.value, "shown": self.shown, "met": self.met}

    def line(self) -> str:
        verdict = {True: "met", False: "NOT met", None: "n/a"}[self.met]
        return f"  [{verdict:>7}] {self.text}: {self.shown}"


def _goal(key: str, text: str, value: float | None, fmt: str, test: Any) -> Goal:
    if value is None:
        return Goal(key, text, None, "no figure (a scenario failed or was not run)", None)
    return Goal(key, text, value, fmt.format(value), bool(test(value)))


def goals(figures: dict[str, Figure], rss: dict[str, int | None]) -> list[Goal]:
    def get(name: str, attr: str) -> float | None:
        figure = figures.get(name)
        value = getattr(figure, attr) if figure else None
        return value if isinstance(value, float) else None

    def extra(name: str, key: str) -> float | None:
        figure = figures.get(name)
        return figure.extra_median(key) if figure else None

    def both(a: float | None, b: float | None, fmt: str) -> str:
        """A ratio's two figures, to follow it (numbers: no braces left for format)."""
        shown = ["-" if v is None else fmt.format(v) for v in (a, b)]
        return f" ({shown[0]} vs {shown[1]})"

    start, end = rss.get("start"), rss.get("end")
    growth = (end / start - 1) if start and end else None
    split = ""
    if start:
        # Both kinds run on the one worker: whose scenarios the growth came with.
        split = ", over the engine's scenarios {:+.1%}, raw Celery's {:+.1%}".format(
            (rss.get("grown_engine") or 0) / start, (rss.get("grown_raw") or 0) / start
        )
    wide = figures.get("fan_20000")
    wide_growth = wide.rss_growth if wide and not wide.failed else None
    engine_rate, raw_rate = extra("many_runs", "runs_per_s"), extra("many_chains", "runs_per_s")
    orgs_rate = extra("many_runs_orgs", "runs_per_s")
    engine_p95, raw_p95 = extra("many_runs", "p95_latency_s"), extra("many_chains", "p95_latency_s")
    return [
        _goal(
            "seq_scaling",
            "seq_1000 per-step cost within 1.2x of seq_100",
            ratio(get("seq_1000", "ms_per_step"), get("seq_100", "ms_per_step")),
            "{:.2f}x",
            lambda v: v <= 1.2,
        ),
        _goal(
            "seq_vs_chain",
            "seq_100 per step at most 1.0x a raw chain hop (chain_100)",
            ratio(get("seq_100", "ms_per_step"), get("chain_100", "ms_per_step")),
            "{:.2f}x",
            lambda v: v <= 1.0,
        ),
        _goal(
            "fan_vs_group",
            "fan_2000 throughput at least 1.0x raw group_2000",
            ratio(get("fan_2000", "steps_per_s"), get("group_2000", "steps_per_s")),
            "{:.2f}x",
            lambda v: v >= 1.0,
        ),
        _goal(
            "fan_vs_chord",
            "fan_2000 wall at most 0.7x raw chord_2000's (same 2,001 steps)",
            ratio(get("fan_2000", "wall_s"), get("chord_2000", "wall_s")),
            "{:.2f}x the chord's wall time",
            lambda v: v <= 0.7,
        ),
        _goal(
            "start_latency",
            "start latency at most 4x raw apply_async -> start",
            ratio(get("start_latency", "wall_s"), get("start_latency_raw", "wall_s")),
            "{:.2f}x",
            lambda v: v <= 4.0,
        ),
        _goal(
            "dag_vs_fan",
            "dag_1000 per node within 1.3x of fan_2000 per step",
            ratio(get("dag_1000", "ms_per_step"), get("fan_2000", "ms_per_step")),
            "{:.2f}x",
            lambda v: v <= 1.3,
        ),
        _goal(
            "worker_memory",
            "worker memory growth at most 10% (RSS end vs start, after warm-up)",
            growth,
            "{:+.1%}" + f" ({start} -> {end} KiB{split})",
            lambda v: v <= 0.10,
        ),
        _goal(
            "many_runs_throughput",
            "many_runs (one organization) runs/s at least 1.0x raw many_chains (500 x 5 steps, "
            "the same clients)",
            ratio(engine_rate, raw_rate),
            "{:.2f}x" + both(engine_rate, raw_rate, "{:.1f} runs/s"),
            lambda v: v >= 1.0,
        ),
        _goal(
            "many_runs_orgs_throughput",
            "many_runs_orgs (8 organizations) runs/s at least 1.0x raw many_chains",
            ratio(orgs_rate, raw_rate),
            "{:.2f}x" + both(orgs_rate, raw_rate, "{:.1f} runs/s"),
            lambda v: v >= 1.0,
        ),
        _goal(
            "many_runs_latency",
            "many_runs p95 completion latency at most 1.0x raw many_chains' p95",
            ratio(engine_p95, raw_p95),
            "{:.2f}x" + both(engine_p95, raw_p95, "{:.3f} s"),
            lambda v: v <= 1.0,
        ),
        _goal(
            "fan_scaling",
            "fan_20000 per-step cost within 1.2x of fan_2000",
            ratio(get("fan_20000", "ms_per_step"), get("fan_2000", "ms_per_step")),
            "{:.2f}x"
            + both(get("fan_20000", "ms_per_step"), get("fan_2000", "ms_per_step"), "{:.2f} ms"),
            lambda v: v <= 1.2,
        ),
        _goal(
            "fan_20000_memory",
            "worker memory growth over fan_20000 at most 10% (RSS just before vs just after)",
            wide_growth,
            "{:+.1%}"
            + (f" ({wide.rss_median(0)} -> {wide.rss_median(1)} KiB)" if wide is not None else ""),
            lambda v: v <= 0.10,
        ),
        _goal(
            "sleep_efficiency",
            "fan_sleep efficiency at least raw group_sleep's (one run over the wide fleet)",
            ratio(extra("fan_sleep", "efficiency"), extra("group_sleep", "efficiency")),
            "{:.2f}x"
            + both(extra("fan_sleep", "efficiency"), extra("group_sleep", "efficiency"), "{:.2f}"),
            lambda v: v >= 1.0,
        ),
        _goal(
            "wide_fan_wall",
            "fan_2000 on the wide fleet within 1.2x of its wall on the default worker",
            ratio(get("fan_2000_wide", "wall_s"), get("fan_2000", "wall_s")),
            "{:.2f}x" + both(get("fan_2000_wide", "wall_s"), get("fan_2000", "wall_s"), "{:.2f} s"),
            lambda v: v <= 1.2,
        ),
        _goal(
            "noisy_neighbour_b",
            "noisy_neighbour: B's 5-step run beside A's 20,000-step fan-out within 2x of idle",
            extra("noisy_neighbour", "b_ratio"),
            "{:.2f}x"
            + both(
                extra("noisy_neighbour", "b_beside_s"),
                extra("noisy_neighbour", "b_idle_s"),
                "{:.3f} s",
            )
            + both_unfair(extra("noisy_neighbour_unfair", "b_ratio")),
            lambda v: v <= 2.0,
        ),
        _goal(
            "noisy_neighbour_a",
            "noisy_neighbour: A's fan-out beside B within 10% of alone (wall time)",
            extra("noisy_neighbour", "a_ratio"),
            "{:.3f}x"
            + both(
                get("noisy_neighbour", "wall_s"), extra("noisy_neighbour", "a_alone_s"), "{:.1f} s"
            )
            + both_unfair(extra("noisy_neighbour_unfair", "a_ratio")),
            lambda v: v <= 1.10,
        ),
        _goal(
            "fan_2000_tool",
            "fan_2000 of a decorated fleet tool within 5% of fan_2000 (wall time)",
            ratio(get("fan_2000_tool", "wall_s"), get("fan_2000", "wall_s")),
            "{:.3f}x" + both(get("fan_2000_tool", "wall_s"), get("fan_2000", "wall_s"), "{:.2f} s"),
            lambda v: v <= 1.05,
        ),
        _goal(
            "runner_jobs_rate",
            "runner_jobs: one orch worker (concurrency 8) serves at least 150 no-op jobs/s",
            extra("runner_jobs", "jobs_per_s"),
            "{:.1f} jobs/s"
            + both(
                extra("runner_jobs", "jobs_per_s"),
                extra("runner_jobs_reference", "jobs_per_s"),
                "{:.1f}",
            ).replace(" vs ", " vs the reference runner's "),
            lambda v: v >= 150,
        ),
        _goal(
            "runner_jobs_overhead",
            "runner_jobs: claim to report p50 at most 20 ms",
            extra("runner_jobs", "p50_claim_to_report_ms"),
            "{:.1f} ms",
            lambda v: v <= 20,
        ),
    ]


def both_unfair(value: float | None) -> str:
    """The same figure with fair dispatch off, beside it."""
    return "" if value is None else f"; fair dispatch off: {value:.2f}x"
