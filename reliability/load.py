"""`make load`: the REST API under sustained concurrent load, then every run checked.

1. Start throwaway PostgreSQL and Redis, migrate, create organizations (``create_org``),
   each with credits, one API key per simulated user (the throttle is per key, so the
   default `API_THROTTLE_RATE` stays as it is), a read-only key and a revoked key; then
   gunicorn, two Celery workers and beat (``reliability.stack``).
   The web process alone serves ``reliability.floor`` as its URLconf
   (``reliability.load_settings``): the public routes and the floor's.
2. Unless LOAD_FLOOR_SECONDS is 0: create runs through the API (SEED_RUNS_PER_ORG per
   organization) and wait until they end; then three phases of LOAD_USERS clients for
   LOAD_FLOOR_SECONDS (20) each, with no think time: the *floor* (``GET
   /api/v1/load-floor``: one row read by primary key through authentication and DRF,
   nothing of the API's own logic), the *reads* (a run, and runs by status, of those
   runs) and the *saturated mix* (the mix's requests in its proportions, each sent as
   soon as the last is answered; the runs it creates end before the mix starts). They
   measure what the server can answer: the reads and the saturated mix as fractions of
   the floor's requests/s (``CAPACITY_GOALS``).
3. The *mix*: LOAD_USERS clients (50) for LOAD_SECONDS (60) after they are all up,
   creating runs with Idempotency-Keys (replaying some), starting, polling, listing,
   cancelling and deleting them, plus a share of bad requests
   (``reliability.load_mix.BAD_KINDS``), each client waiting 0.1 - 0.9 s between
   requests: the realistic latency figure (its p95).
   Each phase runs locust headless in a child process of its own
   (``reliability.load_users``: gevent's monkey-patching stays out of this process,
   which uses Django's ORM).
4. Wait (bounded) until every run in the database is terminal, then the checks of
   `make chaos` (``reliability.checks``): ledgers settle, nothing charged twice,
   invariants clean; and the runs the clients saw created (in the saturated mix and the
   mix) are exactly the runs stored (besides the seeded ones), no refused request stored
   one, no key acted on another organization's run.

Prints a markdown report (the floor, the reads, the saturated mix and the mix side by
side with the ratios of their requests/s and the goals for them, the mix's p95; requests
per second, p50/p95/p99 by endpoint, statuses, bad requests by kind, consistency);
LOAD_JSON=path also writes it as JSON. Exits 1 on any 5xx (in any phase), any unexpected
answer and any inconsistency; the capacity goals are informational.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from reliability.checks import detail_lines
from reliability.load_mix import (
    API,
    BAD_KINDS,
    PHASES,
    RUNS,
    SEED_CANCEL_EVERY,
    SEED_RUNS_PER_ORG,
    THINK_TIME_S,
    good_plan,
)
from reliability.stack import ROOT, Stack

# Names of runs that refused requests carry: none of them may ever be stored.
REFUSED_NAMES = ("load-refused", "load-bad", "load-changed-body", "too-big")
# The web process's settings: the stack's, with the floor's URLconf.
LOAD_SETTINGS_MODULE = "reliability.load_settings"
# Requests/s of the reads and of the whole mix without think time as a fraction of the
# floor's: the goals of the API capacity rounds. Informational, like `make bench`'s:
# reported, never asserted. The mix with its think time is held to no throughput: its
# think time caps it (``capacity``); its p95 is the latency a client sees.
CAPACITY_GOALS = {"reads": 0.6, "mix_saturated": 0.35}
# The phases before the mix, each LOAD_FLOOR_SECONDS long (none when it is 0).
MEASURED_PHASES = ("floor", "reads", "mix_saturated")


@dataclass(frozen=True)
class Config:
    users: int = 50
    seconds: float = 60.0
    # Each of the floor, reads and saturated mix phases; 0 skips them (and the runs
    # seeded for the reads).
    floor_seconds: float = 20.0
    orgs: int = 5
    seed: int = 1
    spawn_rate: float = 25.0
    # Locust lets each user finish the task in hand (create, then start) when stopping.
    stop_timeout_s: float = 20.0
    settle_timeout_s: float = 180.0
    # Sync gunicorn workers wait on PostgreSQL most of a request: more than the 2 cores.
    web_workers: int = 4


# --------------------------------------------------------------------------- setup
def create_organizations(stack: Stack, config: Config) -> list[dict[str, Any]]:
    """Organizations with credits and the keys the users need (Django set up)."""
    from billing.models import ApiKeyScope, Organization
    from billing.services import api_key_create, api_key_revoke

    per_org = -(-config.users // config.orgs)  # one key per user, rounded up
    orgs = []
    for index in range(config.orgs):
        name = f"load-org-{index}"
        created = json.loads(stack.manage("create_org", name, "--credits", "1000000"))
        organization = Organization.objects.get(pk=created["organization_id"])
        keys = [created["api_key"]]
        keys += [
            api_key_create(organization=organization, name=f"user-{n}")[1]
            for n in range(1, per_org)
        ]
        _, read_key = api_key_create(
            organization=organization, name="dashboard", scope=ApiKeyScope.READ
        )
        revoked, revoked_key = api_key_create(organization=organization, name="revoked")
        api_key_revoke(api_key=revoked)
        orgs.append(
            {
                "name": name,
                "organization_id": created["organization_id"],
                "keys": keys,
                "read_key": read_key,
                "revoked_key": revoked_key,
            }
        )
    return orgs


def run_users(
    stack: Stack, config: Config, orgs: list[dict[str, Any]], phase: str, seconds: float
) -> dict[str, Any]:
    """One locust phase (``PHASES``), in a child process; its statistics."""
    directory = stack.directory
    config_path = directory / f"load-config-{phase}.json"
    out_path = directory / f"load-stats-{phase}.json"
    config_path.write_text(
        json.dumps(
            {
                "phase": phase,
                "host": stack.base_url,
                "orgs": orgs,
                "users": config.users,
                "seconds": seconds,
                "spawn_rate": config.spawn_rate,
                "stop_timeout": config.stop_timeout_s,
                "seed": config.seed,
            }
        )
    )
    log_path = directory / f"load-users-{phase}.log"
    budget = config.users / config.spawn_rate + seconds + config.stop_timeout_s + 120
    with log_path.open("wb") as log:
        result = subprocess.run(
            [sys.executable, "-m", "reliability.load_users", "--config", str(config_path),
             "--out", str(out_path)],
            cwd=ROOT, env=stack.env, stdout=log, stderr=subprocess.STDOUT, timeout=budget,
            check=False,
        )  # fmt: skip
    if result.returncode != 0 or not out_path.exists():
        tail = log_path.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"the {phase} phase exited with {result.returncode}:\n{tail}")
    stats: dict[str, Any] = json.loads(out_path.read_text())
    return stats


def warm_up(stack: Stack, orgs: list[dict[str, Any]]) -> None:
    """A few requests to every web worker before the clock starts, not counted: each
    worker imports the API's modules on its first request, a cost no real client sees
    after a deploy has settled."""
    import httpx

    def one(key: str) -> None:
        with httpx.Client(base_url=stack.base_url, trust_env=False, timeout=30) as client:
            for _ in range(3):
                client.get(f"{API}/billing/balance", headers={"Authorization": f"Bearer {key}"})

    keys = [org["keys"][0] for org in orgs]
    with ThreadPoolExecutor(max_workers=stack.web_workers * 2) as pool:
        list(pool.map(one, [keys[i % len(keys)] for i in range(stack.web_workers * 2)]))


def seed_runs(stack: Stack, orgs: list[dict[str, Any]], seed: int) -> list[str]:
    """Runs for the reads phase, created through the API with each organization's first
    key: most start (and complete), every SEED_CANCEL_EVERY-th is cancelled before it
    starts. Each organization's ids go in its ``runs``; returns them all."""
    import httpx

    def create(org: dict[str, Any]) -> list[str]:
        rng = random.Random(f"{seed}-{org['name']}")
        auth = {"Authorization": f"Bearer {org['keys'][0]}"}
        ids = []
        with httpx.Client(base_url=stack.base_url, trust_env=False, timeout=30) as client:

            def post(path: str, body: dict[str, Any]) -> Any:
                headers = {**auth, "Idempotency-Key": uuid.uuid4().hex}
                answer = client.post(path, json=body, headers=headers)
                answer.raise_for_status()  # the harness cannot go on without its runs
                return answer.json()

            for n in range(SEED_RUNS_PER_ORG):
                cancel = n % SEED_CANCEL_EVERY == SEED_CANCEL_EVERY - 1
                plan = good_plan(rng, f"load-seed-{org['name']}-{n}")
                run_id = str(post(RUNS, {"plan": plan, "start": not cancel})["id"])
                if cancel:
                    post(f"{RUNS}/{run_id}/cancel", {"reason": "seeded"})
                ids.append(run_id)
        return ids

    with ThreadPoolExecutor(max_workers=len(orgs)) as pool:
        for org, ids in zip(orgs, pool.map(create, orgs), strict=True):
            org["runs"] = ids
    return [run_id for org in orgs for run_id in org["runs"]]


# --------------------------------------------------------------------------- checks
def wait_terminal(run_ids: list[str], timeout: float) -> float:
    """Seconds until every run was terminal (bounded by ``timeout``; stuck runs show in
    the checks afterwards)."""
    from django.db import close_old_connections

    from reliability.checks import non_terminal

    started = time.monotonic()
    while time.monotonic() - started < timeout:
        close_old_connections()
        if not non_terminal(run_ids):
            break
        time.sleep(1.0)  # the workers drain their queues; nothing to wake us earlier
    return time.monotonic() - started


def cross_tenant_events() -> list[str]:
    """Run events written by a key of another organization than the run's (must be none:
    every cross-tenant request must have answered 404 and changed nothing)."""
    from billing.models import ApiKey
    from runs.models import HistoryEvent

    owner = {f"api:{prefix}": org for prefix, org in ApiKey.objects.values_list(
        "prefix", "organization_id")}  # fmt: skip
    rows = (
        HistoryEvent.objects.filter(actor__startswith="api:")
        .values_list("run_id", "actor", "run__organization_id", "message")
        .distinct()
    )
    return [
        f"run {run_id}: '{message}' by {actor} of another organization"
        for run_id, actor, org, message in rows
        if owner.get(actor) != org
    ]


def consistency_report(
    stats: dict[str, Any], settle_timeout: float, seeded: frozenset[str] = frozenset()
) -> dict[str, Any]:
    """Wait for the runs to end, then every check (Django set up). ``seeded``: the runs
    the harness created for the reads phase, checked like the others but no client's."""
    from django.db import close_old_connections

    from reliability.checks import check_runs
    from runs.models import Run

    seen = set(stats["runs"])
    stored = {str(pk) for pk in Run.objects.values_list("pk", flat=True)}
    settle_s = wait_terminal(sorted(stored), settle_timeout)
    close_old_connections()
    consistency = check_runs(sorted(stored))
    return {
        "runs_seeded": len(seeded),
        "runs_seen_by_clients": len(seen),
        "runs_in_database": len(stored),
        "runs_missing_from_database": sorted(seen - stored),
        "runs_unseen_by_clients": sorted(stored - seen - seeded),
        "refused_but_stored": Run.objects.filter(name__in=REFUSED_NAMES).count(),
        "cross_tenant_events": cross_tenant_events(),
        "settle_s": settle_s,
        "checks": consistency.as_dict(),
        "checks_ok": consistency.ok,
    }


# --------------------------------------------------------------------------- report
def status_totals(statuses: dict[str, dict[str, int]]) -> dict[str, int]:
    """Answers by status over every endpoint (0: no answer at all)."""
    totals: Counter[str] = Counter()
    for by_status in statuses.values():
        totals.update(by_status)
    return dict(sorted(totals.items(), key=lambda item: int(item[0])))


def server_errors(statuses: dict[str, dict[str, int]]) -> int:
    return sum(n for status, n in status_totals(statuses).items() if int(status) >= 500)


def bad_request_rows(bad: dict[str, dict[str, int]]) -> list[dict[str, Any]]:
    """Each kind of bad request: what was sent, what docs/api.md promises, what came."""
    return [
        {
            "kind": kind,
            "request": f"{spec.method} {spec.route}",
            "what": spec.what,
            "expected": f"{spec.status} {spec.code}",
            "got": bad.get(kind, {}),
            "ok": set(bad.get(kind, {})) <= {str(spec.status)},
        }
        for kind, spec in sorted(BAD_KINDS.items())
    ]


def phase_problems(phase: str, stats: dict[str, Any]) -> list[str]:
    """Why a phase before the mix fails the run: what fails the mix, but for the runs,
    which are checked once, at the end (the floor and the reads create none)."""
    found = []
    errors_5xx = server_errors(stats["statuses"])
    if errors_5xx:
        found.append(f"{phase}: {errors_5xx} answers with a 5xx status")
    if stats["unexpected"]:
        found.append(f"{phase}: {stats['unexpected']} unexpected answers")
    if stats["user_exceptions"]:
        found.append(f"{phase}: {len(stats['user_exceptions'])} kinds of exceptions in the users")
    if stats.get("peak_users", 0) < stats["users"]:
        found.append(f"{phase}: only {stats.get('peak_users', 0)} users ran at once")
    replays = stats.get("replays", {})
    if replays.get("ok", 0) != sum(replays.values()):
        found.append(f"{phase}: idempotent replays: {replays}")
    return found


def problems(report: dict[str, Any]) -> list[str]:
    """Why the run fails; empty when it passes."""
    load = report["load"]
    found = []
    for phase, stats in report.get("phases", {}).items():
        found += phase_problems(phase, stats)
    errors_5xx = server_errors(load["statuses"])
    if errors_5xx:
        found.append(f"{errors_5xx} answers with a 5xx status")
    if load["unexpected"]:
        found.append(f"{load['unexpected']} unexpected answers")
    if load["user_exceptions"]:
        found.append(f"{len(load['user_exceptions'])} kinds of exceptions in the users")
    if load.get("peak_users", 0) < report["config"]["users"]:
        found.append(f"only {load.get('peak_users', 0)} users ran at once")
    if load["replays"].get("ok", 0) != sum(load["replays"].values()):
        found.append(f"idempotent replays: {load['replays']}")
    runs = report["runs"]
    for key in ("runs_missing_from_database", "runs_unseen_by_clients", "cross_tenant_events"):
        if runs[key]:
            found.append(f"{len(runs[key])} {key.replace('_', ' ')}")
    if runs["refused_but_stored"]:
        found.append(f"{runs['refused_but_stored']} runs stored by refused requests")
    checks = runs["checks"]
    for key in ("runs_stuck", "ledgers_unsettled", "step_attempts_charged_twice"):
        if checks[key]:
            found.append(f"{len(checks[key])} {key.replace('_', ' ')}")
    if not checks["invariants"]["clean"]:
        found.append(f"invariants violated: {', '.join(checks['invariants']['violations'])}")
    if report.get("web_log_errors"):
        found.append(f"{len(report['web_log_errors'])} error lines in the web server's log")
    return found


# --------------------------------------------------------------------------- capacity
def phase_row(phase: str, stats: dict[str, Any]) -> dict[str, Any]:
    """A phase's whole figures (locust's aggregate row), its think time and its 5xx."""
    total = stats["total"]
    return {
        "phase": phase,
        "users": stats.get("peak_users", 0),
        "think_s": list(THINK_TIME_S[phase]),
        **{k: total[k] for k in ("requests", "rps", "p50_ms", "p95_ms", "p99_ms", "max_ms")},
        "server_errors": server_errors(stats["statuses"]),
    }


def capacity(report: dict[str, Any]) -> dict[str, Any] | None:
    """The floor, the reads, the saturated mix and the mix side by side, each one's
    requests/s as a fraction of the floor's, the goals for those fractions
    (``CAPACITY_GOALS``) and the mix's p95; None when the phases before the mix were
    skipped."""
    measured = {**report.get("phases", {}), "mix": report["load"]}
    if "floor" not in measured:
        return None
    rows = [phase_row(phase, measured[phase]) for phase in PHASES if phase in measured]
    floor_rps = rows[0]["rps"]
    for row in rows:
        row["of_floor"] = row["rps"] / floor_rps if floor_rps else None
    of_floor = {row["phase"]: row["of_floor"] for row in rows}
    goals = [
        {
            "phase": phase,
            "goal": goal,
            "ratio": of_floor.get(phase),
            "met": (of_floor.get(phase) or 0.0) >= goal,
        }
        for phase, goal in CAPACITY_GOALS.items()
    ]
    ratios = {f"{phase}/floor": of_floor.get(phase) for phase in CAPACITY_GOALS}
    # Each mix user waits between requests: even answers in no time would give it no more
    # than users / mean think time, which bounds the mix's ratio whatever the server does.
    mix = rows[-1]
    mean_think = sum(mix["think_s"]) / 2
    ceiling = mix["users"] / mean_think if mean_think else None
    return {
        "phases": rows,
        "ratios": ratios,
        "goals": goals,
        "mix_p95_ms": mix["p95_ms"],
        "mix_think_ceiling_rps": ceiling,
        "mix_think_ceiling_of_floor": ceiling / floor_rps if ceiling and floor_rps else None,
    }


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _think(seconds: list[float]) -> str:
    low, high = seconds
    return "none" if high == 0 else f"{low:g}-{high:g} s"


GOAL_NAMES = {"reads": "reads", "mix_saturated": "whole mix without think time"}


def format_capacity(report: dict[str, Any]) -> list[str]:
    """The floor, the reads and the mix side by side (the phases' endpoints under them,
    but the mix's, which have their own table), then the goals."""
    figures = report.get("capacity")
    if not figures:
        return [
            "",
            "capacity: the floor, the reads and the saturated mix were skipped (--floor-seconds 0)",
        ]
    config = report["config"]
    lines = [
        "",
        f"capacity: each phase {config['users']} users against the same gunicorn "
        f"({config['web_workers']} workers); requests/s over the whole phase, ramp "
        f"included; the floor is GET /load-floor, one row read through authentication "
        f"and DRF",
        "",
        "| phase | think time | requests | req/s | p50 ms | p95 ms | p99 ms | 5xx | "
        "req/s / floor's |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    phases = report.get("phases", {})
    for row in figures["phases"]:
        lines.append(
            f"| {row['phase']} | {_think(row['think_s'])} | {row['requests']} | "
            f"{row['rps']:.1f} | {_ms(row['p50_ms'])} | {_ms(row['p95_ms'])} | "
            f"{_ms(row['p99_ms'])} | {row['server_errors']} | {_ratio(row['of_floor'])} |"
        )
        stats = phases.get(row["phase"])
        for endpoint in stats["endpoints"] if stats else []:
            label = f"{endpoint['method']} {endpoint['name']}"
            errors = server_errors({label: stats["statuses"].get(label, {})})
            lines.append(
                f"| {row['phase']}: {label} | | {endpoint['requests']} | "
                f"{endpoint['rps']:.1f} | {_ms(endpoint['p50_ms'])} | "
                f"{_ms(endpoint['p95_ms'])} | {_ms(endpoint['p99_ms'])} | {errors} | |"
            )
    lines += ["", "| goal (informational) | ratio | result |", "|---|---:|---|"]
    for goal in figures["goals"]:
        lines.append(
            f"| {GOAL_NAMES[goal['phase']]} >= {goal['goal']:g}x the floor's requests/s | "
            f"{_ratio(goal['ratio'])} | {'met' if goal['met'] else 'NOT met'} |"
        )
    mix = figures["phases"][-1]
    lines += [
        "",
        f"the mix with its think time, the latency a client sees: p95 {_ms(mix['p95_ms'])} ms",
    ]
    ceiling = figures.get("mix_think_ceiling_rps")
    if ceiling:
        lines += [
            "",
            f"the mix's think time ({_think(mix['think_s'])}) caps it at "
            f"{ceiling:.0f} requests/s with {mix['users']} users, however "
            f"fast the answers: {_ratio(figures['mix_think_ceiling_of_floor'])} of the floor's",
        ]
    return lines


def _statuses(by_status: dict[str, int]) -> str:
    return ", ".join(f"{status}: {n}" for status, n in by_status.items()) or "-"


def format_report(report: dict[str, Any]) -> str:
    """The markdown the command prints: load, latency by endpoint, bad requests, checks."""
    load, runs, config = report["load"], report["runs"], report["config"]
    total = load["total"]
    lines = [
        "",
        f"load: {load.get('peak_users', 0)} users ({config['orgs']} organizations, one API "
        f"key each) against gunicorn ({config['web_workers']} workers) for "
        f"{load['window_s']:.0f} s after a {load['ramp_s']:.1f} s ramp; "
        f"{total['requests']} requests in {load['duration_s']:.0f} s = "
        f"{total['rps']:.1f} requests/s; p50 {_ms(total['p50_ms'])} ms, "
        f"p95 {_ms(total['p95_ms'])} ms, p99 {_ms(total['p99_ms'])} ms",
        "",
        "| endpoint | requests | req/s | p50 ms | p95 ms | p99 ms | max ms | statuses |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    statuses = load["statuses"]
    for row in load["endpoints"]:
        label = f"{row['method']} {row['name']}"
        by_status = statuses.get(label)
        lines.append(
            f"| {label} | {row['requests']} | {row['rps']:.1f} | {_ms(row['p50_ms'])} | "
            f"{_ms(row['p95_ms'])} | {_ms(row['p99_ms'])} | {_ms(row['max_ms'])} | "
            f"{_statuses(by_status or {})} |"
        )
    lines.append(
        f"| **all** | {total['requests']} | {total['rps']:.1f} | {_ms(total['p50_ms'])} | "
        f"{_ms(total['p95_ms'])} | {_ms(total['p99_ms'])} | {_ms(total['max_ms'])} | "
        f"{_statuses(status_totals(statuses))} |"
    )
    lines += format_capacity(report)
    lines += ["", "| bad request | sent | expected | got |", "|---|---|---|---|"]
    for row in bad_request_rows(load["bad_requests"]):
        mark = "" if row["ok"] else " **UNEXPECTED**"
        lines.append(
            f"| {row['kind']} | {row['request']}: {row['what']} | {row['expected']} | "
            f"{_statuses(row['got'])}{mark} |"
        )
    checks = runs["checks"]
    replays = load["replays"]
    rows = [
        ("5xx answers", server_errors(statuses)),
        ("unexpected answers", load["unexpected"]),
        ("idempotent replays (200, `Idempotent-Replayed: true`, same run)",
         f"{replays.get('ok', 0)} of {sum(replays.values())}"),
        ("runs created (seen by clients / in the database)",
         f"{runs['runs_seen_by_clients']} / {runs['runs_in_database']}"),
        ("runs seeded for the reads (in the database, no client's)",
         runs.get("runs_seeded", 0)),
        ("runs by final status", _statuses(checks["runs_by_status"])),
        ("after the load, every run terminal within", f"{runs['settle_s']:.1f} s"),
        ("runs stuck (not terminal)", len(checks["runs_stuck"])),
        ("runs whose ledger does not settle", len(checks["ledgers_unsettled"])),
        ("step attempts charged twice", len(checks["step_attempts_charged_twice"])),
        ("check_invariants", "clean" if checks["invariants"]["clean"] else "VIOLATED"),
        ("runs stored by refused requests", runs["refused_but_stored"]),
        ("run events by another organization's key", len(runs["cross_tenant_events"])),
        ("web log error lines", len(report.get("web_log_errors", []))),
        ("worker/beat log error lines", report["worker_log_errors"]["lines"]),
        ("verdict", "PASS" if report["ok"] else "FAIL: " + "; ".join(report["problems"])),
    ]  # fmt: skip
    lines += ["", "| check | result |", "|---|---|"]
    lines += [f"| {name} | {value} |" for name, value in rows]
    lines += detail_lines(
        [
            ("unexpected answers (samples)", load["unexpected_samples"]),
            (
                "exceptions in the users",
                [f"{e['count']}x {e['msg']}" for e in load["user_exceptions"]],
            ),
            ("stuck runs", checks["runs_stuck"]),
            ("unsettled ledgers", checks["ledgers_unsettled"]),
            ("charged twice", checks["step_attempts_charged_twice"]),
            ("runs missing from the database", runs["runs_missing_from_database"]),
            ("runs no client saw created", runs["runs_unseen_by_clients"]),
            ("cross-tenant events", runs["cross_tenant_events"]),
            ("web log errors", report.get("web_log_errors", [])),
        ],
        checks["invariants"]["violations"],
        report["worker_log_errors"]["distinct"],
        "worker/beat log errors (most frequent)",
    )
    return "\n".join(lines)


# --------------------------------------------------------------------------- main
def run_load(config: Config, directory: Path, log: Any = print) -> dict[str, Any]:
    from reliability.chaos_report import LOG_PROBLEM, log_problems
    from reliability.storm import StackTarget

    stack = Stack(
        directory, web_workers=config.web_workers, web_settings_module=LOAD_SETTINGS_MODULE
    )
    try:
        log(f"==> servers in {directory}")
        stack.start_servers()
        os.environ.update(stack.env)
        import django

        django.setup()
        stack.migrate()
        orgs = create_organizations(stack, config)
        log(f"==> web ({config.web_workers} gunicorn workers), 2 Celery workers, beat")
        stack.start_processes()
        warm_up(stack, orgs)
        started = time.time()
        phases: dict[str, dict[str, Any]] = {}
        seeded: list[str] = []
        created: dict[str, str] = {}  # run id -> organization, of the saturated mix
        if config.floor_seconds > 0:
            seeded = seed_runs(stack, orgs, config.seed)
            # The workers idle again before the clock starts: the floor and the reads
            # measure the web server, not the web server beside the engine.
            log(f"==> {len(seeded)} runs created for the reads; waiting for them to end")
            wait_terminal(seeded, config.settle_timeout_s)
            for phase in MEASURED_PHASES:
                log(f"==> {phase}: {config.users} users for {config.floor_seconds:g}s")
                phase_stats = run_users(stack, config, orgs, phase, config.floor_seconds)
                created.update(phase_stats.get("runs", {}))
                phases[phase] = {k: v for k, v in phase_stats.items() if k != "runs"}
            # The mix's latency is measured beside its own runs only, not the backlog of
            # the saturated mix's.
            log(f"==> {len(created)} runs created by the saturated mix; waiting for them")
            wait_terminal(sorted(created), config.settle_timeout_s)
        log(f"==> mix: {config.users} users for {config.seconds:g}s (locust, headless)")
        stats = run_users(stack, config, orgs, "mix", config.seconds)
        stats["runs"] = {**created, **stats["runs"]}  # every run a client saw created
        log(f"==> load done; waiting (at most {config.settle_timeout_s:g}s) for every run")
        runs = consistency_report(stats, config.settle_timeout_s, frozenset(seeded))
        report: dict[str, Any] = {
            "config": asdict(config),
            "started_at": datetime.fromtimestamp(started, UTC).isoformat(),
            "directory": str(directory),
            "load": {k: v for k, v in stats.items() if k != "runs"},
            "phases": phases,
            "bad_requests": bad_request_rows(stats["bad_requests"]),
            "status_totals": status_totals(stats["statuses"]),
            "server_errors": server_errors(stats["statuses"]),
            "runs": runs,
            "worker_log_errors": log_problems(StackTarget(stack).outputs()),
            # No fault is injected here: any error the web server logs is a finding.
            "web_log_errors": [
                line[:300]
                for line in stack.processes["web"].output().splitlines()
                if LOG_PROBLEM.search(line)
            ][:50],
        }
        report["capacity"] = capacity(report)
        report["problems"] = problems(report)
        report["ok"] = not report["problems"]
        return report
    finally:
        stack.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m reliability.load", description=(__doc__ or "").split("\n")[0]
    )
    parser.add_argument("--users", type=int, default=int(os.environ.get("LOAD_USERS") or 50))
    parser.add_argument(
        "--seconds", type=float, default=float(os.environ.get("LOAD_SECONDS") or 60)
    )
    parser.add_argument(
        "--floor-seconds",
        type=float,
        default=float(os.environ.get("LOAD_FLOOR_SECONDS") or Config.floor_seconds),
        help="seconds of each of the floor, reads and saturated mix phases before the mix "
        "(0: none)",
    )
    parser.add_argument("--orgs", type=int, default=5)
    parser.add_argument("--seed", type=int, default=int(os.environ.get("LOAD_SEED") or 1))
    parser.add_argument("--web-workers", type=int, default=Config.web_workers)
    parser.add_argument("--settle-timeout", type=float, default=Config.settle_timeout_s)
    parser.add_argument("--json", default=os.environ.get("LOAD_JSON", ""))
    parser.add_argument("--keep", action="store_true", help="keep the directory (logs, data)")
    args = parser.parse_args(argv)
    if args.users < 1 or args.orgs < 2 or args.seconds <= 0 or args.floor_seconds < 0:
        parser.error(
            "need at least 1 user, 2 organizations, a positive duration and a floor's of 0 or more"
        )
    config = Config(
        users=args.users,
        seconds=args.seconds,
        floor_seconds=args.floor_seconds,
        orgs=args.orgs,
        seed=args.seed,
        spawn_rate=min(25.0, float(args.users)),
        settle_timeout_s=args.settle_timeout,
        web_workers=args.web_workers,
    )
    directory = Path(tempfile.mkdtemp(prefix="orchestrator-load."))
    try:
        report = run_load(config, directory, log=lambda t: print(t, file=sys.stderr, flush=True))
    except Exception as exc:  # noqa: BLE001 - the harness itself failed: say so, keep the logs
        print(f"load test could not run: {type(exc).__name__}: {exc}", file=sys.stderr)
        print(f"logs and data kept in {directory}", file=sys.stderr)
        return 1
    print(format_report(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2, default=str))
    # A pass with worker errors keeps its logs too: an intermittent error is found by
    # its traceback, which the report only counts.
    clean = report["ok"] and not report["worker_log_errors"]["lines"]
    if not args.keep and clean:
        shutil.rmtree(directory, ignore_errors=True)
    else:
        print(f"\nlogs and data kept in {directory}", file=sys.stderr)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
