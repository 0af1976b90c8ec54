"""`make chaos`: a mixed workload through the REST API while the stack is broken on purpose.

1. Start throwaway PostgreSQL and Redis, then web (gunicorn), two workers with their own
   hostnames, and beat (``reliability.stack``), with short leases and sweeps so that
   recovery happens within minutes.
2. Submit runs of every shape (``reliability.workload``) from several client threads,
   each POST with its Idempotency-Key and retried on connection errors like a real
   client; cancel some, pause and resume others, approve what waits for approval.
3. Meanwhile inject faults on a seeded random schedule (printed in the report): SIGKILL
   of worker pool children and of whole workers, Redis restarts (one losing its data),
   a PostgreSQL restart, duplicated step and run messages, a second beat, the web server
   killed and restarted.
4. Wait (bounded) until every run is terminal, then check: nothing lost or duplicated,
   every outcome explained, every ledger settled, no step attempt charged twice, no side
   effect executed twice for one attempt, every invariant clean.

The report is a table on stdout and, with ``--json PATH`` (CHAOS_JSON), JSON. The exit
status is 1 when anything is lost or inconsistent. ``--short`` is the version that runs
inside `make test` (tests/integration/test_chaos.py).

This module holds what is `make chaos`'s own: its settings, its faults on the one-host
stack and its entry point. The storm it shares with `make chaos-net` is
``reliability.storm``; what the clients do, ``reliability.chaos_clients``; what the report
finds, ``reliability.chaos_report``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from reliability.chaos_clients import RunBook
from reliability.chaos_report import format_report
from reliability.stack import Stack, wait_for
from reliability.storm import Fault, Injector, StackTarget, Workload, storm
from reliability.workload import (
    CHAOS_MAX_RUNNING_RUNS,
    CHAOS_MAX_RUNNING_STEPS,
    RUNNER_COMMAND,
    EffectServer,
)

# Leases, sweeps and lost-message re-sends tuned so that recovery from every fault fits in
# a run of a few minutes. Everything else is the local settings `make run` uses.
CHAOS_SETTINGS = {
    "ENGINE_HEARTBEAT_SECONDS": "1",
    "ENGINE_LEASE_SECONDS": "5",
    "ENGINE_SWEEP_INTERVAL": "2",
    "ENGINE_LOST_MESSAGE_AFTER": "10",
    "HTTP_TOOL_ALLOWED_NETWORKS": "127.0.0.1/32",  # the harness's own effect endpoint
    "API_THROTTLE_RATE": "100000/min",
    "CELERY_WORKER_SEND_TASK_EVENTS": "false",
    # A killed runner's registration goes stale in seconds, not minutes, so that its
    # restart reconnects (and its jobs are recovered) inside the fault window.
    "RUNNER_HEARTBEAT_INTERVAL": "2",
    "RUNNER_STALE_AFTER": "6",
    # Webhooks (reliability/webhooks.py): a receiver failing a third of the time is
    # retried within seconds, and a delivery whose worker was killed is sent again soon.
    "WEBHOOK_BACKOFF": "0.5",
    "WEBHOOK_BACKOFF_MAX": "4",
    "WEBHOOK_TIMEOUT": "5",
    "WEBHOOK_LEASE": "8",
}


@dataclass(frozen=True)
class Config(Workload):
    child_kills: int = 60
    worker_kills: int = 2
    redis_restarts: int = 2  # the last one loses Redis's data
    postgres_restarts: int = 1
    web_restarts: int = 2
    runner_kills: int = 2
    duplicate_bursts: int = 8
    second_beat: bool = True

    @classmethod
    def short(cls, seed: int) -> Config:
        """About 20 runs, a handful of kills, one Redis restart: fits inside make test."""
        return cls(
            runs=20,
            seed=seed,
            window_s=24.0,
            clients=4,
            child_kills=6,
            worker_kills=0,
            redis_restarts=1,
            postgres_restarts=0,
            web_restarts=0,
            runner_kills=0,
            duplicate_bursts=2,
            second_beat=False,
            settle_timeout_s=150.0,
        )


# --------------------------------------------------------------------------- faults
def fault_schedule(config: Config, rng: random.Random) -> list[Fault]:
    w = config.window_s
    faults = [Fault(rng.uniform(2, w), "kill_worker_child") for _ in range(config.child_kills)]
    faults += [
        Fault(rng.uniform(0.2 * w, 0.8 * w), "kill_worker") for _ in range(config.worker_kills)
    ]
    for i in range(config.redis_restarts):
        lose = i == config.redis_restarts - 1
        slot = (i + 1) / (config.redis_restarts + 1)
        faults.append(
            Fault(w * slot + rng.uniform(-0.05, 0.05) * w,
                  "restart_redis_losing_data" if lose else "restart_redis")
        )  # fmt: skip
    faults += [
        Fault(rng.uniform(0.3 * w, 0.7 * w), "restart_postgres")
        for _ in range(config.postgres_restarts)
    ]
    faults += [
        Fault(rng.uniform(0.1 * w, 0.9 * w), "restart_web") for _ in range(config.web_restarts)
    ]
    faults += [
        Fault(rng.uniform(0.1 * w, w), "duplicate_messages") for _ in range(config.duplicate_bursts)
    ]
    faults += [
        Fault(rng.uniform(0.2 * w, 0.8 * w), "kill_runner") for _ in range(config.runner_kills)
    ]
    if config.second_beat:
        faults += [Fault(0.2 * w, "start_second_beat"), Fault(0.6 * w, "stop_second_beat")]
    return sorted(faults, key=lambda fault: fault.at_s)


def publish_duplicates(run_ids: list[str], rng: random.Random) -> str:
    """Re-publish the execute message of random steps and the pick-up of random runs."""
    from django.db import close_old_connections

    from config.celery import QUEUE_RUNS_NORMAL, QUEUE_STEPS, app
    from orchestrator.transport import EXECUTE_STEP_TASK, PICK_UP_TASK
    from runs.models import Step

    close_old_connections()
    if not run_ids:
        return "no runs yet"
    chosen = rng.sample(run_ids, min(5, len(run_ids)))
    steps = list(Step.objects.filter(run_id__in=chosen).values_list("pk", flat=True)[:40])
    # As the engine publishes them (orchestrator.transport): no result asked for.
    for step_id in steps:
        app.send_task(
            EXECUTE_STEP_TASK, args=(step_id,), queue=QUEUE_STEPS, priority=5, ignore_result=True
        )
    for run_id in chosen:
        app.send_task(
            PICK_UP_TASK, args=(run_id,), queue=QUEUE_RUNS_NORMAL, priority=5, ignore_result=True
        )
    return f"{len(steps)} step and {len(chosen)} run messages"


class StackInjector(Injector):
    """`make chaos`'s faults, on the one-host stack."""

    def __init__(
        self, stack: Stack, schedule: list[Fault], rng: random.Random, runs: RunBook
    ) -> None:
        super().__init__(schedule, rng, runs)
        self.stack = stack

    def inject(self, fault: Fault) -> str:
        stack, kind = self.stack, fault.kind
        if kind == "kill_worker_child":
            return stack.kill_worker_child(self.rng)
        if kind == "kill_worker":
            return stack.kill_worker(self.rng)
        if kind == "restart_redis":
            return stack.restart_redis(lose_data=False)
        if kind == "restart_redis_losing_data":
            return stack.restart_redis(lose_data=True)
        if kind == "restart_postgres":
            return stack.restart_postgres()
        if kind == "restart_web":
            return stack.restart_web()
        if kind == "kill_runner":
            return stack.kill_runner()
        if kind == "duplicate_messages":
            return publish_duplicates(self.runs.ids(), self.rng)
        if kind == "start_second_beat":
            return stack.start_second_beat()
        if kind == "stop_second_beat":
            return stack.stop_second_beat()
        raise ValueError(kind)


# --------------------------------------------------------------------------- main
def run_chaos(config: Config, directory: Path, log: Any = print) -> dict[str, Any]:
    rng = random.Random(config.seed)
    stack = Stack(directory, settings_env=dict(CHAOS_SETTINGS))
    effects = EffectServer()
    try:
        log(f"==> servers in {directory}")
        stack.start_servers()
        os.environ.update(stack.env)
        import django

        django.setup()
        stack.migrate()
        org = json.loads(stack.manage("create_org", f"chaos-{config.seed}", "--credits", "1000000"))
        # Limits that bind (docs/fairness.md): runs wait for a place and steps for a slot
        # while the faults strike; the report checks none was lost or exceeded.
        stack.manage(
            "set_limits",
            f"chaos-{config.seed}",
            "--max-running-runs",
            str(CHAOS_MAX_RUNNING_RUNS),
            "--max-running-steps",
            str(CHAOS_MAX_RUNNING_STEPS),
        )
        log("==> web, 2 workers, beat, a runner")
        stack.start_processes()
        script = directory / "runner_job.py"
        script.write_text(RUNNER_COMMAND)
        stack.start_runner(org["api_key"], script, effects.url)
        stack.start_worker(org["api_key"], effects.url)
        wait_for_worker(stack, org["api_key"])
        report = storm(
            config,
            rng,
            StackTarget(stack),
            effects,
            org["api_key"],
            lambda book, draw: StackInjector(stack, fault_schedule(config, draw), draw, book),
            log,
        )
        report["directory"] = str(directory)
        return report
    finally:
        effects.close()
        stack.close()


def wait_for_worker(stack: Stack, api_key: str) -> None:
    """Until the `orch worker` has registered: its tool is in the organization's
    catalogue, which the worker_tool runs' plans are checked against."""

    def online() -> bool:
        try:
            answer = httpx.get(
                f"{stack.base_url}/api/v1/tools/chaos.effect",
                headers={"Authorization": f"Bearer {api_key}"},
                timeout=5,
            )
        except httpx.TransportError:
            return False  # a web still starting on a loaded machine: asked again
        return answer.status_code == 200 and bool(answer.json()["offered_by"])

    wait_for(online, 60, "the orch worker to register")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m reliability.chaos", description=(__doc__ or "").split("\n")[0]
    )
    parser.add_argument("--seed", type=int, default=int(os.environ.get("CHAOS_SEED") or 1))
    parser.add_argument("--runs", type=int, default=int(os.environ.get("CHAOS_RUNS") or 200))
    parser.add_argument("--short", action="store_true", help="the make-test version: ~20 runs")
    parser.add_argument("--json", default=os.environ.get("CHAOS_JSON", ""))
    parser.add_argument("--keep", action="store_true", help="keep the directory (logs, data)")
    args = parser.parse_args(argv)
    config = Config.short(args.seed) if args.short else Config(runs=args.runs, seed=args.seed)
    directory = Path(tempfile.mkdtemp(prefix="orchestrator-chaos."))
    report = run_chaos(config, directory, log=lambda text: print(text, file=sys.stderr, flush=True))
    print(format_report(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2, default=str))
    if not args.keep and report["ok"]:
        import shutil

        shutil.rmtree(directory, ignore_errors=True)
    else:
        print(f"\nlogs and data kept in {directory}", file=sys.stderr)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
