"""The storm that `make chaos` and `make chaos-net` share: runs of every shape submitted
by several clients while faults strike, then everything checked.

``storm`` takes what differs between the two as arguments: the system under test (a
``Target``: one host's stack, or the cluster) and the faults (an ``Injector`` thread,
built for the run book the clients fill). It draws every run's shape and fate from one
seeded random generator, sends them from ``Workload.clients`` threads over the window,
waits (bounded) until every run has ended and every webhook delivery was sent, and
returns the report: ``reliability.chaos_report``'s findings and the verdict.
"""

from __future__ import annotations

import queue
import random
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol, TypeAlias

from reliability.chaos_clients import (
    RESUMED_OR_FORKED,
    RunBook,
    Submitted,
    approver,
    create_schedule,
    declare_rate_limit,
    drive,
    pause_schedule,
)
from reliability.chaos_report import (
    effect_problems,
    limit_problems,
    log_problems,
    outcome_problems,
    pick_up_latency,
    policy_summary,
    rate_limit_report,
    schedule_report,
    sweep_recoveries,
)
from reliability.client import Client, GaveUp, Tally
from reliability.stack import Stack, wait_for
from reliability.webhooks import WebhookReceiver, pending_deliveries, webhook_report
from reliability.workload import KINDS, EffectServer, plan_for


@dataclass(frozen=True)
class Workload:
    """What the clients do: shared by `make chaos` and `make chaos-net`."""

    runs: int = 200
    seed: int = 1
    window_s: float = 150.0  # faults are injected during this window
    clients: int = 6
    cancel_share: float = 0.1
    pause_share: float = 0.12
    settle_timeout_s: float = 360.0
    kinds: tuple[str, ...] = KINDS  # the plans' shapes, in turn (reliability.workload)
    # Runs are submitted over about this share of the window (plus what cancels and
    # pauses wait): between two runs a client waits uniform(0, 2 x) the mean that spreads
    # them so. make chaos's runs come over its first 30 %, its faults go on to the end.
    submit_share: float = 0.3


# --------------------------------------------------------------------------- faults
@dataclass
class Fault:
    at_s: float
    kind: str
    happened_at: float = 0.0  # unix time it was injected
    result: str = ""
    # What was measured around it (make chaos-net: seconds until progress, ...).
    measured: dict[str, float] = field(default_factory=dict)


class Injector(threading.Thread):
    """Injects ``schedule``'s faults at their times (or, when the one before took longer,
    as soon as it is done): one at a time, each reported in its ``result``."""

    def __init__(self, schedule: list[Fault], rng: random.Random, runs: RunBook) -> None:
        super().__init__(name="fault-injector", daemon=True)
        self.schedule, self.rng, self.runs = schedule, rng, runs
        self.started_at = 0.0

    def run(self) -> None:
        self.started_at = time.monotonic()
        for fault in self.schedule:
            delay = fault.at_s - (time.monotonic() - self.started_at)
            if delay > 0:
                time.sleep(delay)  # the schedule itself: faults happen at set times
            fault.happened_at = time.time()
            try:
                fault.result = self.inject(fault)
            except Exception as exc:  # noqa: BLE001 - a fault that could not be injected is reported
                fault.result = f"not injected: {type(exc).__name__}: {exc}"

    def inject(self, fault: Fault) -> str:
        raise NotImplementedError


# --------------------------------------------------------------------------- targets
class Target(Protocol):
    """What the storm needs of the system under test (one host, or `make chaos-net`'s
    cluster)."""

    @property
    def base_urls(self) -> list[str]:
        """The web hosts' URLs: clients spread over them and fail over between them."""
        ...

    @property
    def unexpected_exits(self) -> list[str]: ...

    def supervise(self, stop: threading.Event) -> None:
        """Restart what exits by itself, remembering it, until ``stop``."""

    def outputs(self) -> Iterable[tuple[str, str]]:
        """(process name, its log) of the workers and beats, for ``log_problems``."""
        ...


@dataclass
class StackTarget:
    stack: Stack

    @property
    def base_urls(self) -> list[str]:
        return [self.stack.base_url]

    @property
    def unexpected_exits(self) -> list[str]:
        return self.stack.unexpected_exits

    def supervise(self, stop: threading.Event) -> None:
        self.stack.supervise(stop)

    def outputs(self) -> Iterable[tuple[str, str]]:
        return ((n, p.output()) for n, p in self.stack.processes.items() if n != "web")


# --------------------------------------------------------------------------- the storm
Work: TypeAlias = queue.Queue[tuple[Submitted, dict[str, Any], random.Random]]


def storm(
    config: Workload,
    rng: random.Random,
    target: Target,
    effects: EffectServer,
    key: str,
    injector_for: Callable[[RunBook, random.Random], Injector],
    log: Any,
) -> dict[str, Any]:
    """Submit ``config``'s runs through ``target``'s web hosts while ``injector_for``'s
    faults strike, wait for every run to end, and check everything (the report)."""
    tally = Tally()
    book, work = _submissions(config, rng, effects.url)
    injector = injector_for(book, random.Random(rng.random()))
    urls = target.base_urls

    def client(n: int = 0) -> Client:
        # Each submitting client starts on a web host of its own and fails over to the next.
        return Client(urls[n % len(urls)], key, tally, fallbacks=urls)

    if "rate_limited" in config.kinds:
        declare_rate_limit(client())
    # Every run's end is told to a webhook receiver that fails a third of the time.
    hooks = WebhookReceiver(effects.host, seed=rng.randrange(2**32))
    hooks.register(client())
    schedule_id = create_schedule(client(), effects.url)
    log(f"==> {config.runs} runs from {config.clients} clients; {len(injector.schedule)} faults "
        f"over {config.window_s:g}s (seed {config.seed})")  # fmt: skip
    stop = threading.Event()
    approval_client = client()
    approving = threading.Thread(target=approver, args=(approval_client, stop), daemon=True)
    supervisor = threading.Thread(target=target.supervise, args=(stop,), daemon=True)
    supervisor.start()
    started = time.time()
    injector.start()
    approving.start()
    _submit(config, work, client)
    # No new scheduled run once the clients are done: the schedule's runs share the
    # organization's slots with the storm's, and must end like the rest.
    pause_schedule(client(), schedule_id)
    injector.join()
    log(f"==> faults done after {time.time() - started:.0f}s; waiting for every run to end")
    _wait_until_ended(config, book, schedule_id, log)
    stop.set()
    approving.join(10)
    supervisor.join(10)
    approval_client.close()
    return _report(config, book, injector.schedule, started, schedule_id, hooks, tally, target,
                   effects)  # fmt: skip


def _submissions(config: Workload, rng: random.Random, effects_url: str) -> tuple[RunBook, Work]:
    """Every run the clients will submit, in the book, with its plan and its own random
    generator: each kind in turn, a share drawn to be cancelled or paused, the rest of
    the kinds in RESUMED_OR_FORKED resumed or forked once they end."""
    book = RunBook()
    work: Work = queue.Queue()
    for index in range(config.runs):
        kind = config.kinds[index % len(config.kinds)]
        draw = rng.random()
        control = (
            "cancel"
            if draw < config.cancel_share
            else "pause"
            if draw < config.cancel_share + config.pause_share
            else ""
        )
        if not control and kind in RESUMED_OR_FORKED:
            control = RESUMED_OR_FORKED[kind]
        item = Submitted(index, kind, control)
        book.add(item)
        work.put((item, plan_for(kind, index, effects_url, rng), random.Random(rng.random())))
    return book, work


def _submit(config: Workload, work: Work, client: Callable[[int], Client]) -> None:
    """``config.clients`` threads drive the runs of ``work`` until none is left, each
    waiting a random while after each run so that they come over the window's
    ``submit_share``."""
    pace = 2 * config.window_s * config.submit_share * config.clients / max(config.runs, 1)
    clients = [
        threading.Thread(target=_drive_until_done, args=(client(n), work, pace), daemon=True)
        for n in range(config.clients)
    ]
    for thread in clients:
        thread.start()
    for thread in clients:
        thread.join()


def _drive_until_done(client: Client, work: Work, pace: float) -> None:
    try:
        while True:
            try:
                item, plan, item_rng = work.get_nowait()
            except queue.Empty:
                return
            try:
                drive(client, item, plan, item_rng)
            except GaveUp as exc:
                item.error = str(exc)
            except Exception:  # noqa: BLE001 - reported, never silently lost
                item.error = traceback.format_exc(limit=3)
            time.sleep(item_rng.uniform(0, pace))  # spread submissions over the window
    finally:
        client.close()


def _wait_until_ended(config: Workload, book: RunBook, schedule_id: str, log: Any) -> None:
    """Until every run (the schedule's too) has ended, then every webhook delivery has
    been sent; each wait bounded, its timeout logged and left to the report."""
    from django.db import OperationalError, close_old_connections

    from reliability.checks import non_terminal

    def settled() -> bool:
        try:
            close_old_connections()
            return not non_terminal(book.ids() + schedule_report(schedule_id)["run_ids"])
        except OperationalError:
            return False

    try:
        wait_for(settled, config.settle_timeout_s, "every run to reach a terminal state")
    except TimeoutError as exc:
        log(f"!! {exc}")

    def told() -> bool:
        try:
            close_old_connections()
            return pending_deliveries() == 0
        except OperationalError:
            return False

    try:
        # Once the runs are terminal, what is left is retries seconds apart.
        wait_for(told, min(120.0, config.settle_timeout_s), "every webhook delivery to be sent")
    except TimeoutError as exc:
        log(f"!! {exc}")


def _report(
    config: Workload,
    book: RunBook,
    schedule: list[Fault],
    started: float,
    schedule_id: str,
    hooks: WebhookReceiver,
    tally: Tally,
    target: Target,
    effects: EffectServer,
) -> dict[str, Any]:
    """Everything the storm left, read once it is over, and the verdict."""
    from django.db import close_old_connections

    from reliability.checks import check_runs
    from runs.models import Run

    close_old_connections()
    scheduled = schedule_report(schedule_id)
    webhooks = webhook_report(hooks)
    hooks.close()
    consistency = check_runs(book.ids() + scheduled["run_ids"])
    last_fault = max((f.happened_at for f in schedule), default=started)
    last_end = (
        Run.objects.filter(pk__in=book.ids())
        .order_by("-status_changed_at")
        .values_list("status_changed_at", flat=True)
        .first()
    )
    # The runs submitted: child runs (started by `run` steps) are counted apart.
    org_runs = Run.objects.filter(
        name__startswith="chaos-", parent_run__isnull=True, forked_from_run__isnull=True
    ).count()
    child_runs = Run.objects.filter(name__startswith="chaos-", parent_run__isnull=False).count()
    report: dict[str, Any] = {
        "seed": config.seed,
        "config": asdict(config),
        "started_at": datetime.fromtimestamp(started, UTC).isoformat(),
        "runs_requested": config.runs,
        "runs_created": len(book.ids()),
        "runs_in_database": org_runs,
        "child_runs": child_runs,
        "policy": policy_summary(book),
        "limits": limit_problems(book),
        "rate_limit": rate_limit_report(),
        "schedule": {k: v for k, v in scheduled.items() if k != "run_ids"},
        "webhooks": webhooks,
        "submission_errors": [f"#{i.index} {i.kind}: {i.error}" for i in book.items if i.error],
        "controls": dict(Counter(i.control or "none" for i in book.items)),
        "resumed": sum(1 for i in book.items if i.resumed),
        "forked": sum(1 for i in book.items if i.fork_id),
        "faults": [asdict(f) for f in schedule],
        "faults_by_kind": dict(Counter(f.kind for f in schedule if not f.result.startswith("not"))),
        "consistency": consistency.as_dict(),
        "side_effects": effect_problems(book, effects.log.snapshot()),
        "unexplained_outcomes": outcome_problems(book),
        "api": {
            "statuses": {str(k): v for k, v in sorted(tally.statuses.items())},
            "connection_errors": tally.connection_errors,
            "retries": tally.retries,
            "server_errors": tally.server_errors,
        },
        "recovery_s": (last_end.timestamp() - last_fault) if last_end else 0.0,
        "pick_up_latency": pick_up_latency(book),
        "recovered_by_sweeps": sweep_recoveries(book),
        "worker_log_errors": log_problems(target.outputs()),
        "unexpected_exits": list(target.unexpected_exits),
    }
    report["ok"] = consistency.ok and _passed(report)
    return report


def _passed(report: dict[str, Any]) -> bool:
    """Every run submitted once and accounted for, every effect once, every limit kept,
    every due time fired once and every run's end told: the rest of the verdict."""
    effects, limits, schedule = report["side_effects"], report["limits"], report["schedule"]
    return bool(
        report["runs_created"] == report["runs_requested"]
        and report["runs_in_database"] == report["runs_requested"]
        and not report["submission_errors"]
        and not report["unexplained_outcomes"]
        and not effects["executed_twice"]
        and not effects["phantom_attempts"]
        and not effects["completed_without_effect"]
        and not effects["recorded_from_another_attempt"]
        and not effects["borrowed_steps_that_ran"]
        and not report["api"]["server_errors"]
        and not report["unexpected_exits"]
        and not limits["keys_over_their_limit"]
        and not limits["over_the_organization_limit"]
        and not report["rate_limit"]["windows_over_the_limit"]
        and not schedule["due_times_fired_twice"]
        and not schedule["fires_without_their_run"]
        and schedule["fired"] > 0
        and report["webhooks"]["ok"]
    )
