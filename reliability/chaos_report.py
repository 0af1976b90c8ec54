"""After the storm: what `make chaos` and `make chaos-net` find, and their report.

Each function reads one thing from PostgreSQL (Django set up by the caller) or from the
processes' logs and says what went wrong with it: side effects run twice or for an
attempt the database never had, runs whose end no fault explains, limits exceeded, a
scheduled due time fired twice, a rate limit's window over its limit; the sweeps'
recoveries and the pick-up latency are reported beside them. ``format_report`` writes the
whole report as the table `make chaos` prints.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

from reliability.chaos_clients import SCHEDULE_EVERY, RunBook
from reliability.checks import detail_lines, with_descendants
from reliability.workload import CHAOS_MAX_RUNNING_RUNS, EXPECTED, RATE_LIMIT

LOG_PROBLEM = re.compile(r"\b(ERROR|CRITICAL)\b|Traceback")


def log_problems(outputs: Iterable[tuple[str, str]]) -> dict[str, Any]:
    """ERROR/CRITICAL lines of (process name, its output), grouped by their gist."""
    gists: Counter[str] = Counter()
    for name, output in outputs:
        for line in output.splitlines():
            if LOG_PROBLEM.search(line):
                gist = re.sub(r"[0-9a-f]{8}-[0-9a-f-]{27}|\d+", "N", line.split("] ", 1)[-1])
                gists[f"{name.split('-')[0]}: {gist[:160]}"] += 1
    return {"lines": sum(gists.values()), "distinct": dict(gists.most_common(15))}


def effect_problems(book: RunBook, effects: Counter[tuple[int, int]]) -> dict[str, Any]:
    """Side effects run twice for one attempt, or for an attempt the database never had."""
    from runs.models import Step

    twice = sorted(f"step {s} attempt {a}: {n} times" for (s, a), n in effects.items() if n > 1)
    attempts = dict(
        Step.objects.filter(pk__in={s for s, _ in effects}).values_list("pk", "attempts")
    )
    phantom = sorted(
        f"step {s} attempt {a} (the database counts {attempts.get(s)})"
        for (s, a) in effects
        if a > attempts.get(s, 0)
    )
    # Steps completed with another step's output (a retry reusing, a fork, a cache hit)
    # ran nothing: their effect is the other step's.
    ran = Step.objects.filter(
        run_id__in=with_descendants(book.ids()), reused_from__isnull=True, cached_from__isnull=True
    )
    borrowed = Step.objects.filter(run_id__in=with_descendants(book.ids())).exclude(
        pk__in=ran.values("pk")
    )
    borrowed_ran = sorted(
        f"step {s} attempt {a}: completed with another step's output, yet its tool ran"
        for s in borrowed.values_list("pk", flat=True)
        for (step, a) in effects
        if step == s
    )
    completed_once = ran.filter(
        tool__in=("http", "runner", "chaos.effect"),
        status="completed",
    ).values_list("pk", "attempts")
    missing = sorted(
        f"step {pk} completed on attempt {n} but its effect was not seen"
        for pk, n in completed_once
        if effects.get((pk, n), 0) == 0
    )
    # The effect endpoint answers with the attempt it saw: a completed step whose
    # recorded answer is another attempt's took a stale worker's outcome (what the
    # attempt number fences out).
    answers = ran.filter(tool="http", status="completed").values_list(
        "pk", "attempts", "output__body__attempt"
    )
    stale = sorted(
        f"step {pk} is on attempt {n} but recorded attempt {seen}'s answer"
        for pk, n, seen in answers
        if seen is not None and int(seen) != n
    )
    # Effects whose attempt lost its lease before it could record (a worker killed or
    # cut off): each ran again under a new attempt, the old outcome never recorded.
    superseded = sum(1 for (s, a) in effects if a < attempts.get(s, 0))
    return {
        "executions": sum(effects.values()),
        "step_attempts": len(effects),
        "executed_twice": twice,
        "phantom_attempts": phantom,
        "completed_without_effect": missing,
        "recorded_from_another_attempt": stale,
        "effects_of_superseded_attempts": superseded,
        "borrowed_steps": borrowed.filter(status="completed").count(),
        "borrowed_steps_that_ran": borrowed_ran,
    }


def sweep_recoveries(book: RunBook) -> dict[str, int]:
    """What the sweeps did: the proof that lost messages and dead workers were recovered."""
    from django.db.models import Sum
    from django.db.models.functions import Coalesce

    from runs.models import HistoryEvent, Run, Step

    runs = book.ids()
    resent = HistoryEvent.objects.filter(
        run_id__in=runs, actor="sweep", message__startswith="re-sent"
    ).values_list("payload", flat=True)
    return {
        "step_messages_resent": sum(len(payload.get("steps", [])) for payload in resent),
        "runs_with_pickup_or_resume_resent": Run.objects.filter(
            pk__in=runs, redispatched_at__isnull=False
        ).count(),
        "step_leases_reclaimed": Step.objects.filter(run_id__in=runs).aggregate(
            n=Coalesce(Sum("reclaims"), 0)
        )["n"],
        "steps_failed_worker_lost": Step.objects.filter(
            run_id__in=runs, error__code="worker_lost"
        ).count(),
    }


def pick_up_latency(book: RunBook) -> dict[str, float]:
    """Seconds from a run's creation (it is started at once) to its pick-up by a worker."""
    from runs.models import Run

    waits = sorted(
        (picked - created).total_seconds()
        for created, picked in Run.objects.filter(
            pk__in=book.ids(), picked_up_at__isnull=False
        ).values_list("created_at", "picked_up_at")
        if picked is not None
    )
    if not waits:
        return {"p50_s": 0.0, "max_s": 0.0, "over_10s": 0}
    return {
        "p50_s": waits[len(waits) // 2],
        "max_s": waits[-1],
        "over_10s": sum(1 for wait in waits if wait > 10),
    }


def policy_summary(book: RunBook) -> str:
    """How often runs escalated (and were resumed by on-call) and were re-planned."""
    from runs.models import EscalationTicket, Replan

    tickets = EscalationTicket.objects.filter(run_id__in=book.ids())
    resumed = tickets.filter(resolution="resume").count()
    spawned = Replan.objects.filter(run_id__in=book.ids(), status="spawned").count()
    return f"{tickets.count()} ({resumed}) / {spawned}"


def limit_problems(book: RunBook) -> dict[str, Any]:
    """Runs that waited for a place (with a `queue` event), and any moment when more runs
    than their concurrency key allows, or than the organization allows, ran at once
    (from each run's pick-up to its end)."""
    from runs.models import EventKind, HistoryEvent, Run

    runs = list(
        Run.objects.filter(
            pk__in=book.ids(), parent_run__isnull=True, picked_up_at__isnull=False
        ).values_list("pk", "concurrency_key", "picked_up_at", "status_changed_at", "status")
    )
    waited = (
        HistoryEvent.objects.filter(run_id__in=book.ids(), kind=EventKind.QUEUE)
        .exclude(message="admitted")
        .values("run_id")
        .distinct()
        .count()
    )

    def most_at_once(spans: list[tuple[Any, Any]]) -> int:
        edges = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
        running = most = 0
        for _, step in edges:
            running += step
            most = max(most, running)
        return most

    def span(picked: Any, changed: Any, status: str) -> tuple[Any, Any]:
        ended = status in ("completed", "failed", "cancelled")
        return (picked, changed if ended else datetime.now(UTC))

    by_key: dict[str, list[tuple[Any, Any]]] = {}
    for _, key, picked, changed, status in runs:
        if key:
            by_key.setdefault(key, []).append(span(picked, changed, status))
    over_key = {key: n for key, spans in by_key.items() if (n := most_at_once(spans)) > 1}
    everyone = most_at_once([span(p, c, s) for _, _, p, c, s in runs])
    return {
        "waited": waited,
        "keyed_runs": sum(len(spans) for spans in by_key.values()),
        "keys_over_their_limit": over_key,
        "most_running_at_once": everyone,
        "over_the_organization_limit": max(0, everyone - CHAOS_MAX_RUNNING_RUNS),
    }


def schedule_report(schedule_id: str) -> dict[str, Any]:
    """The schedule's due times, from PostgreSQL: each fired once, with its own run."""
    from schedules.models import FireKind, FireStatus, ScheduleFire

    fires = list(
        ScheduleFire.objects.filter(schedule_id=schedule_id, kind=FireKind.SCHEDULED).values_list(
            "due_at", "status", "reason", "run_id"
        )
    )
    fired = [fire for fire in fires if fire[1] == FireStatus.FIRED]
    runs = [str(run) for *_, run in fired if run is not None]
    due = Counter(due_at for due_at, *_ in fires)
    return {
        "every": SCHEDULE_EVERY,
        "due_times": len(due),
        "fired": len(fired),
        "skipped": dict(Counter(reason for _, status, reason, _ in fires if status != "fired")),
        "due_times_fired_twice": sum(1 for n in due.values() if n > 1),
        "fires_without_their_run": len(fired) - len(set(runs)),
        "run_ids": runs,
    }


def rate_limit_report() -> dict[str, Any]:
    """The `rate_limited` runs' grants (from PostgreSQL, where the windows are): in any
    window of the period, at most the limit (docs/rate-limits.md), whatever struck."""
    from ratelimits.models import RateGrant
    from runs.plan.durations import read_duration_ms

    name, most, period = RATE_LIMIT
    window = timedelta(milliseconds=read_duration_ms(period))
    grants: dict[str, list[tuple[datetime, int]]] = {}
    for bucket, at, units in RateGrant.objects.filter(
        bucket__contains=f":{name}:", used=True
    ).values_list("bucket", "granted_at", "units"):
        grants.setdefault(bucket, []).append((at, units))
    heaviest = 0
    for rows in grants.values():
        rows.sort()
        end, inside = 0, 0
        for start in range(len(rows)):
            while end < len(rows) and rows[end][0] < rows[start][0] + window:
                inside += rows[end][1]
                end += 1
            heaviest = max(heaviest, inside)
            inside -= rows[start][1]
    return {
        "limit": f"{most} per {period}",
        "grants": sum(len(rows) for rows in grants.values()),
        "buckets": len(grants),
        "heaviest_window": heaviest,
        "windows_over_the_limit": heaviest > most,
    }


def outcome_problems(book: RunBook) -> list[str]:
    """Runs whose final status no fault or action explains."""
    from runs.models import Run

    forks = [item.fork_id for item in book.items if item.fork_id]
    found = {
        str(pk): (status, last_error or {})
        for pk, status, last_error in Run.objects.filter(pk__in=book.ids() + forks).values_list(
            "pk", "status", "last_error"
        )
    }
    problems = []
    runs = [(item, item.run_id) for item in book.items if item.run_id]
    runs += [(item, item.fork_id) for item in book.items if item.fork_id]
    for item, run_id in runs:
        status, error = found.get(run_id, ("missing", {}))
        expected = {EXPECTED[item.kind]}  # a fork ends as its source would have
        if item.cancelled and run_id == item.run_id:
            expected = {"cancelled"}
        elif item.control == "cancel":
            expected.add("cancelled")  # the cancel may have landed after a retry, or not
        # A step whose worker was killed at every try ends worker_lost (by design).
        if status == "failed" and error.get("code") == "worker_lost":
            expected.add("failed")
        # The same, in a child run its sync step waited for.
        if error.get("code") == "child_failed" and "worker_lost" in error.get("message", ""):
            expected.add("failed")
        if status not in expected:
            problems.append(
                f"{run_id} ({item.kind}{', ' + item.control if item.control else ''}): "
                f"{status}, expected {' or '.join(sorted(expected))}; last_error {error}"
            )
    return problems


def format_report(report: dict[str, Any], title: str = "chaos") -> str:
    lines = ["", f"{title}: seed {report['seed']}, {report['runs_requested']} runs", ""]
    lines.append("| check | result |")
    lines.append("|---|---|")
    consistency = report["consistency"]
    effects = report["side_effects"]
    recovery = (
        f"{report['recovery_s']:.1f} s"
        if report["recovery_s"] >= 0
        else "every run had ended before the last fault"
    )
    pickup = report["pick_up_latency"]
    pickups = f"{pickup['p50_s']:.2f} s / {pickup['max_s']:.2f} s ({pickup['over_10s']} over 10 s)"
    by_status = ", ".join(f"{k} {v}" for k, v in consistency["runs_by_status"].items())
    executed = f"{effects['executions']} for {effects['step_attempts']} step attempts"
    rows = [
        ("runs by final status (child runs included)", by_status),
        ("runs created / requested", f"{report['runs_created']} / {report['runs_requested']}"),
        ("runs in the database (duplicates or losses show here)", report["runs_in_database"]),
        ("child runs their `run` steps started", report["child_runs"]),
        ("escalations (resolved by on-call) / re-plans spawned", report["policy"]),
        ("runs that waited for a place / most running at once (limit)", (
            f"{report['limits']['waited']} / {report['limits']['most_running_at_once']} "
            f"({CHAOS_MAX_RUNNING_RUNS})"
        )),
        ("keyed runs / keys over their limit (1)", (
            f"{report['limits']['keyed_runs']} / {len(report['limits']['keys_over_their_limit'])}"
        )),
        ("scheduled due times: fired / skipped / fired twice", (
            f"{report['schedule']['fired']} / {sum(report['schedule']['skipped'].values())} "
            f"{report['schedule']['skipped'] or ''} / {report['schedule']['due_times_fired_twice']}"
        )),
        ("rate-limited grants / heaviest window (limit)", (
            f"{report['rate_limit']['grants']} / {report['rate_limit']['heaviest_window']} "
            f"({report['rate_limit']['limit']})"
        )),
        ("webhooks: terminal runs not told / deliveries lost / bad signatures", (
            f"{len(report['webhooks']['terminal_runs_not_told'])} of "
            f"{report['webhooks']['terminal_runs']} / "
            f"{len(report['webhooks']['deliveries_lost'])} of {report['webhooks']['deliveries']} / "
            f"{report['webhooks']['bad_signatures']} ({report['webhooks']['requests']} requests, "
            f"{report['webhooks']['answered_500_on_purpose']} answered 500 on purpose)"
        )),
        ("faults injected", ", ".join(f"{k} {v}" for k, v in report["faults_by_kind"].items())),
        ("side effects executed", executed),
        ("side effects executed twice for one attempt", len(effects["executed_twice"])),
        ("side effects for attempts the database never had", len(effects["phantom_attempts"])),
        ("completed effect steps, effect unseen", len(effects["completed_without_effect"])),
        ("effect steps that recorded another attempt's answer (fencing)",
         len(effects["recorded_from_another_attempt"])),
        ("effects of attempts superseded after a lost lease (run again)",
         effects["effects_of_superseded_attempts"]),
        ("runs resumed reusing / forked; steps completed with another's output (tool ran)", (
            f"{report['resumed']} / {report['forked']}; {effects['borrowed_steps']} "
            f"({len(effects['borrowed_steps_that_ran'])})"
        )),
        ("step attempts charged twice", len(consistency["step_attempts_charged_twice"])),
        ("runs whose ledger does not settle", len(consistency["ledgers_unsettled"])),
        ("check_invariants", "clean" if consistency["invariants"]["clean"] else "VIOLATED"),
        ("runs stuck (not terminal)", len(consistency["runs_stuck"])),
        ("outcomes no fault explains", len(report["unexplained_outcomes"])),
        ("API answers 5xx (not 502-504)", len(report["api"]["server_errors"])),
        ("API connection errors retried", report["api"]["connection_errors"]),
        ("last fault -> last run terminal", recovery),
        ("pick-up latency p50 / max", pickups),
        ("recovered by the sweeps", ", ".join(
            f"{k.replace('_', ' ')} {v}" for k, v in report["recovered_by_sweeps"].items()
        )),
        ("processes that exited by themselves (restarted)", len(report["unexpected_exits"])),
        ("worker/beat log error lines", report["worker_log_errors"]["lines"]),
        ("verdict", "PASS" if report["ok"] else "FAIL"),
    ]  # fmt: skip
    lines += [f"| {name} | {value} |" for name, value in rows]
    lines += ["", "fault schedule (seconds after the first submission):"]
    lines += [f"  {f['at_s']:7.2f}  {f['kind']:<26} {f['result']}" for f in report["faults"]]
    lines += detail_lines(
        [
            ("unexplained outcomes", report["unexplained_outcomes"]),
            ("stuck runs", consistency["runs_stuck"]),
            ("unsettled ledgers", consistency["ledgers_unsettled"]),
            ("charged twice", consistency["step_attempts_charged_twice"]),
            ("effects twice", effects["executed_twice"]),
            ("phantom effects", effects["phantom_attempts"]),
            ("effects missing", effects["completed_without_effect"]),
            ("outcomes recorded from another attempt", effects["recorded_from_another_attempt"]),
            ("borrowed steps whose tool ran", effects["borrowed_steps_that_ran"]),
            ("API 5xx", report["api"]["server_errors"]),
            ("processes that exited by themselves", report["unexpected_exits"]),
            ("submission errors", report["submission_errors"]),
            ("runs whose end no webhook told", report["webhooks"]["terminal_runs_not_told"]),
            ("webhook deliveries lost", report["webhooks"]["deliveries_lost"]),
        ],
        consistency["invariants"]["violations"],
        report["worker_log_errors"]["distinct"],
        "worker/beat log errors (most frequent; faults cause some by design)",
    )
    return "\n".join(lines)
