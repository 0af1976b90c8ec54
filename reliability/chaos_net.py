"""`make chaos-net`: `make chaos`'s workload on `make cluster`'s fourteen hosts, while
hosts are cut off, lost and failed over on a seeded schedule (root only).

1. Build the cluster (reliability.cluster: network namespaces on a bridge of their own,
   PostgreSQL db1 + its synchronous replica db2, Redis redis1 + redis2 under three
   Sentinels, web1-2, worker1-3, beat, the runner host) with `make chaos`'s short leases
   and sweeps; the effect endpoint listens on the harness's own address, 198.18.0.1,
   which is the only address the `http` tool may reach (HTTP_TOOL_ALLOWED_NETWORKS).
2. Submit the chaos runs (reliability.workload: every shape, plus `slow` runs whose
   effect answers after SLOW_EFFECT_S) from clients spread over both web hosts, each
   failing over to the other on a connection error as behind a load balancer.
3. Meanwhile inject, one at a time in a seeded order, each on a seeded host:
   - a worker host partitioned from PostgreSQL only, chosen while it holds leases (one
     on a slow effect if any): its leases expire, its steps run again elsewhere, and
     what it tries to record when it comes back must be fenced (refused: another
     attempt holds the step);
   - a worker host partitioned from Redis only (broker, results, Sentinels);
   - a web host cut off from everything for 30 s (its link down);
   - a whole worker host lost (link down, every process killed at once), back later;
   - the runner host lost while it runs a job, back later;
   - the PostgreSQL primary's host lost: the harness, as a failover manager would,
     promotes the replica; the old primary is rebuilt as the new one's synchronous
     replica before the next fault (no fault is injected while the new primary runs
     alone);
   - the Redis primary's host lost: the Sentinels promote the replica; the old primary
     comes back as its replica.
   Each partition is healed and each lost host brought back after a delay. For each
   fault, a probe run (one step, another organization) is submitted right after the
   fault strikes; the seconds until it completes are the time until the system made
   progress again. For a worker or runner host, also the seconds until every step it
   held a lease on ran again elsewhere (or ended).
4. Wait for every run to end and check as `make chaos` does (effects once per attempt,
   no outcome recorded from another attempt, ledgers settle, no step attempt charged
   twice, invariants, nothing stuck, no 5xx but 502-504), then remove every namespace
   and process (``--keep`` keeps them for a look, with `make cluster-down` after).

The report is `make chaos`'s table with a fault table under it, and JSON with ``--json``
(CHAOS_NET_JSON). Exit status 1 when anything is lost or inconsistent.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from reliability import cluster as net
from reliability.chaos import CHAOS_SETTINGS
from reliability.chaos_clients import RunBook
from reliability.chaos_report import format_report
from reliability.client import Client, GaveUp, Tally
from reliability.storm import Fault, Injector, Workload, storm
from reliability.workload import (
    CHAOS_MAX_RUNNING_RUNS,
    NET_KINDS,
    RUNNER_COMMAND,
    SLOW_EFFECT_S,
    EffectServer,
)

NET_SETTINGS = {
    **CHAOS_SETTINGS,
    "HTTP_TOOL_ALLOWED_NETWORKS": f"{net.HARNESS}/32",
    # Shorter than the lease, as the defaults are (30 s against 60 s): the locks of a
    # worker cut off mid-transaction go before its leases could be reclaimed.
    "DATABASE_IDLE_IN_TRANSACTION_TIMEOUT_S": "4",
}
# Six worker processes: the organization may use them all, so every worker host holds
# leases when one is cut off.
NET_MAX_RUNNING_STEPS = 6
WORKERS = ("worker1", "worker2", "worker3")
WEBS = ("web1", "web2")
REDIS_HOSTS = ("redis1", "redis2", "sentinel1", "sentinel2", "sentinel3")
# A runner job takes this long (its effect's answer): the runner host is lost mid-job.
RUNNER_JOB_S = 2.0


@dataclass(frozen=True)
class NetConfig(Workload):
    window_s: float = 220.0  # about the schedule's length: runs are submitted all along
    submit_share: float = 1.0
    kinds: tuple[str, ...] = NET_KINDS
    # A worker host cut off from PostgreSQL comes back while the attempt run again
    # elsewhere still runs (SLOW_EFFECT_S), on the connection it had: longer than the
    # lease (5 s) and its sweep, shorter than keepalives take to drop the session (10 s
    # idle, then 3 probes 3 s apart), so that what it records meets the fencing.
    postgres_partition_s: float = 8.0
    partition_s: float = 16.0  # from Redis
    web_cut_s: float = 30.0
    host_down_s: float = 15.0
    first_fault_s: float = 12.0
    gap_s: tuple[float, float] = (4.0, 10.0)  # between one fault's end and the next
    probe_timeout_s: float = 120.0
    settle_timeout_s: float = 480.0


FAULT_KINDS = (
    "partition_worker_from_postgres",
    "partition_worker_from_redis",
    "cut_web_host",
    "lose_worker_host",
    "lose_runner_host",
    "lose_postgres_primary",
    "lose_redis_primary",
)


def fault_schedule(config: NetConfig, rng: random.Random) -> list[Fault]:
    """Every kind once, in a seeded order, at times that leave each the room it takes
    (the injector starts a fault late rather than inside the one before)."""
    lasts = {
        "partition_worker_from_postgres": config.postgres_partition_s + 20,
        "partition_worker_from_redis": config.partition_s,
        "cut_web_host": config.web_cut_s,
        "lose_worker_host": config.host_down_s,
        "lose_runner_host": config.host_down_s,
        "lose_postgres_primary": 25.0,
        "lose_redis_primary": 20.0,
    }
    kinds = list(FAULT_KINDS)
    rng.shuffle(kinds)
    faults, at = [], config.first_fault_s
    for kind in kinds:
        faults.append(Fault(round(at, 2), kind))
        at += lasts[kind] + rng.uniform(*config.gap_s)
    return faults


# --------------------------------------------------------------------------- the target
@dataclass
class ClusterTarget:
    """The cluster as `reliability.storm.storm` sees it: two web hosts, processes that
    are started again (and reported) if they exit while their host is up."""

    cluster: net.Cluster
    lock: threading.Lock = field(default_factory=threading.Lock)
    down: set[str] = field(default_factory=set)  # hosts lost on purpose, for now
    exits: list[str] = field(default_factory=list)

    @property
    def base_urls(self) -> list[str]:
        return [f"http://{net.address(h)}:{net.WEB_PORT}" for h in WEBS]

    @property
    def unexpected_exits(self) -> list[str]:
        return self.exits

    def supervise(self, stop: threading.Event) -> None:
        while not stop.wait(1.0):
            with self.lock:
                for name, (host, _, _) in list(self.cluster.launched.items()):
                    if host not in self.down and not self.cluster.alive(name):
                        self.exits.append(f"{name} on {host} exited by itself")
                        self.cluster.restart(name)

    def outputs(self) -> Iterable[tuple[str, str]]:
        for log in sorted(self.cluster.directory.glob("*.log")):
            if log.stem.startswith(("worker", "beat")):
                yield log.stem, log.read_text(errors="replace")

    def lose(self, host: str) -> None:
        with self.lock:
            self.down.add(host)
            self.cluster.lose_host(host)

    def back(self, host: str, how: Callable[[str], object] | None = None) -> None:
        """``host`` back: by ``how`` (a store's rebuild) or as it was (an app host)."""
        with self.lock:
            (how or self.cluster.bring_back)(host)
            self.down.discard(host)


# --------------------------------------------------------------------------- measuring
def _db(query: Any) -> Any:
    """A harness query, tried again while the database fails over (the harness is a
    client like any other)."""
    from django.db import DatabaseError, close_old_connections, connection

    deadline = time.monotonic() + 90
    while True:
        try:
            close_old_connections()
            return query()
        except DatabaseError:
            connection.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)  # a client's backoff while the primary changes


def held_by(host: str) -> dict[int, int]:
    """Steps whose lease ``host``'s workers hold now: {step id: attempt}."""
    from runs.models import Step
    from runs.states import StepStatus

    return dict(
        Step.objects.filter(
            status=StepStatus.RUNNING, worker__contains=f"{host}@{host}"
        ).values_list("pk", "attempts")
    )


def slow_effects_held_by(host: str, claimed_within_s: float | None = None) -> int:
    """Slow effects ``host``'s workers run now (claimed at most ``claimed_within_s``
    ago, when given)."""
    from datetime import timedelta

    from django.utils import timezone

    from runs.models import Step
    from runs.states import StepStatus

    running = Step.objects.filter(
        status=StepStatus.RUNNING,
        worker__contains=f"{host}@{host}",
        tool="http",
        params__json__hold__gt=0,
    )
    if claimed_within_s is not None:
        since = timezone.now() - timedelta(seconds=claimed_within_s)
        running = running.filter(status_changed_at__gte=since)
    return running.count()


def runner_held() -> dict[int, int]:
    """Steps whose job the runner host runs now: {step id: attempt}."""
    from runs.models import RunnerJob, RunnerJobStatus

    return dict(
        RunnerJob.objects.filter(
            status__in=(RunnerJobStatus.CLAIMED, RunnerJobStatus.RUNNING)
        ).values_list("step_id", "attempt")
    )


def jobs_recovered(held: dict[int, int]) -> bool:
    """Every held job (step, attempt) is no longer claimed or running: recovered as
    ``runner_lost`` (or ended)."""
    from runs.models import RunnerJob, RunnerJobStatus

    return not any(
        (step, attempt) in held.items()
        for step, attempt in RunnerJob.objects.filter(
            step_id__in=held, status__in=(RunnerJobStatus.CLAIMED, RunnerJobStatus.RUNNING)
        ).values_list("step_id", "attempt")
    )


ENDED = ("completed", "failed", "skipped", "cancelled")


def moved_on(held: dict[int, int]) -> tuple[bool, bool]:
    """(released, resumed): every held step's lease was given up (the step no longer
    runs that attempt), and every one ran again under a later attempt or ended."""
    from runs.models import Step

    now = {pk: (status, n) for pk, status, n in
           Step.objects.filter(pk__in=held).values_list("pk", "status", "attempts")}  # fmt: skip
    released = all(s != "running" or n > held[pk] for pk, (s, n) in now.items())
    resumed = all(s in ENDED or n > held[pk] for pk, (s, n) in now.items())
    return released, resumed


class Probe(threading.Thread):
    """One small run of the probe organization, submitted at once; ``seconds`` from
    ``since`` until it completed (the system made progress again)."""

    PLAN = {"agents": [{"name": "g", "tasks": [{"name": "t", "steps": [
        {"name": "p", "tool": "echo", "params": {"probe": True}},
    ]}]}]}  # fmt: skip

    def __init__(self, client: Client, name: str, since: float, timeout: float) -> None:
        super().__init__(name=f"probe-{name}", daemon=True)
        self.client, self.run_name, self.since, self.timeout = client, name, since, timeout
        self.seconds = -1.0
        self.error = ""

    def run(self) -> None:
        try:
            created = self.client.request(
                "POST",
                "/api/v1/runs",
                json={"plan": {**self.PLAN, "name": self.run_name}, "start": True},
                idempotency_key=self.run_name,
            )
            # 200 with Idempotent-Replayed: the client sent it again (its answer was
            # late or lost) and this is the run the first request created.
            replayed = created.headers.get("Idempotent-Replayed") == "true"
            if created.status_code != 201 and not (created.status_code == 200 and replayed):
                self.error = f"create: {created.status_code} {created.text[:200]}"
                return
            path = f"/api/v1/runs/{created.json()['id']}"
            deadline = time.monotonic() + self.timeout
            while time.monotonic() < deadline:
                run = self.client.request("GET", path, params={"exclude": "plan"}).json()
                if run["status"] == "completed":
                    self.seconds = time.time() - self.since
                    return
                if run["status"] in ("failed", "cancelled"):
                    self.error = f"the probe run ended {run['status']}"
                    return
                time.sleep(0.2)  # polling, as a client does
            self.error = f"not completed within {self.timeout:g} s"
        except (GaveUp, ValueError, KeyError) as exc:
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            self.client.close()

    def result(self) -> float:
        self.join(self.timeout + 30)
        return round(self.seconds, 1)


# --------------------------------------------------------------------------- faults
class NetInjector(Injector):
    def __init__(
        self,
        target: ClusterTarget,
        config: NetConfig,
        schedule: list[Fault],
        rng: random.Random,
        runs: RunBook,
        probe_key: str,
        probe_tally: Tally,
    ) -> None:
        super().__init__(schedule, rng, runs)
        self.target, self.cluster, self.config = target, target.cluster, config
        self.probe_key, self.probe_tally = probe_key, probe_tally
        self.probes: list[Probe] = []

    def _probe(self, fault: Fault, avoid: str = "") -> Probe:
        """A probe through a web host that is not ``avoid``."""
        urls = [u for u, h in zip(self.target.base_urls, WEBS, strict=True) if h != avoid]
        client = Client(urls[len(self.probes) % len(urls)], self.probe_key, self.probe_tally,
                        deadline_s=self.config.probe_timeout_s, fallbacks=urls)  # fmt: skip
        probe = Probe(client, f"probe-{len(self.probes):02d}-{fault.kind}", fault.happened_at,
                      self.config.probe_timeout_s)  # fmt: skip
        self.probes.append(probe)
        probe.start()
        return probe

    def _watch(self, fault: Fault, held: dict[int, int], jobs: bool = False) -> threading.Thread:
        """From now on, in the background: how long until every step in ``held`` had its
        lease given up (``jobs``: its runner job recovered), and ran again elsewhere (or
        ended); -1 if not within two minutes (a paused run's step waits for its resume).
        Join it before the fault returns."""
        given_up = "jobs_recovered_s" if jobs else "leases_released_s"

        def watch() -> None:
            fault.measured["held_steps"] = len(held)
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                released, resumed = _db(lambda: moved_on(held))
                if jobs:
                    released = _db(lambda: jobs_recovered(held))
                if released and given_up not in fault.measured:
                    fault.measured[given_up] = round(time.time() - fault.happened_at, 1)
                if resumed:
                    fault.measured["held_steps_resumed_s"] = round(
                        time.time() - fault.happened_at, 1
                    )
                    return
                time.sleep(0.25)  # polling the database, as an operator's dashboard would
            fault.measured["held_steps_resumed_s"] = -1.0

        thread = threading.Thread(target=watch, name=f"watch-{fault.kind}", daemon=True)
        thread.start()
        return thread

    def _holding_worker(self, fault: Fault) -> tuple[str, dict[int, int]]:
        """The worker host to cut off: the first one seen holding the lease of a slow
        effect it claimed in the last 2 s (waiting up to 40 s for one), else the one
        holding most leases. Claimed just now, its connection to PostgreSQL has been
        busy just now: the partition ends before keepalives would drop it, and the
        cut-off worker records on it when the answer comes."""
        deadline = time.monotonic() + 40
        while True:
            for host in self.rng.sample(WORKERS, len(WORKERS)):
                if _db(lambda h=host: slow_effects_held_by(h, claimed_within_s=2)):
                    return host, _db(lambda h=host: held_by(h))
            if time.monotonic() > deadline:
                break
            time.sleep(0.25)  # watching for the moment the fault is meant for
        held = {h: _db(lambda h=h: held_by(h)) for h in WORKERS}
        host = max(WORKERS, key=lambda h: len(held[h]))
        return host, held[host]

    def inject(self, fault: Fault) -> str:
        method = getattr(self, fault.kind)
        result: str = method(fault)
        return result

    def partition_worker_from_postgres(self, fault: Fault) -> str:
        host, held = self._holding_worker(fault)
        slow = _db(lambda: slow_effects_held_by(host))
        fault.happened_at = time.time()
        net.partition(host, "db1", "db2")
        probe, watch = self._probe(fault), self._watch(fault, held)
        time.sleep(self.config.postgres_partition_s)  # the partition lasts this long
        net.heal(host, "db1", "db2")
        fault.measured["progress_s"] = probe.result()
        watch.join()
        cut_s = self.config.postgres_partition_s
        return (f"{host} holding {len(held)} leases ({slow} on a slow effect), cut off from "
                f"db1 and db2 for {cut_s:g} s")  # fmt: skip

    def partition_worker_from_redis(self, fault: Fault) -> str:
        host = self.rng.choice(WORKERS)
        net.partition(host, *REDIS_HOSTS)
        probe = self._probe(fault)
        time.sleep(self.config.partition_s)  # the partition lasts this long
        net.heal(host, *REDIS_HOSTS)
        fault.measured["progress_s"] = probe.result()
        return f"{host} cut off from Redis and the Sentinels for {self.config.partition_s:g} s"

    def cut_web_host(self, fault: Fault) -> str:
        host = self.rng.choice(WEBS)
        net.cut(host)
        probe = self._probe(fault, avoid=host)
        time.sleep(self.config.web_cut_s)  # the cut lasts this long
        self.cluster.restore_link(host)
        fault.measured["progress_s"] = probe.result()
        return f"{host} cut off from everything for {self.config.web_cut_s:g} s"

    def lose_worker_host(self, fault: Fault) -> str:
        # The host holding most leases now (ties by the seed's draw).
        held_now = {h: _db(lambda h=h: held_by(h)) for h in self.rng.sample(WORKERS, 3)}
        host = max(held_now, key=lambda h: len(held_now[h]))
        held = held_now[host]
        fault.happened_at = time.time()
        self.target.lose(host)
        probe, watch = self._probe(fault), self._watch(fault, held)
        time.sleep(self.config.host_down_s)  # the host stays lost this long
        self.target.back(host)
        fault.measured["progress_s"] = probe.result()
        watch.join()
        return f"{host} lost with {len(held)} leases, back after {self.config.host_down_s:g} s"

    def lose_runner_host(self, fault: Fault) -> str:
        deadline = time.monotonic() + 30
        while not (held := _db(runner_held)) and time.monotonic() < deadline:
            time.sleep(0.25)  # waiting for a job to be under way: the fault is mid-job
        fault.happened_at = time.time()
        self.target.lose("runner")
        probe, watch = self._probe(fault), self._watch(fault, held, jobs=True)
        time.sleep(self.config.host_down_s)  # the host stays lost this long
        self.target.back("runner")
        fault.measured["progress_s"] = probe.result()
        watch.join()
        return (
            f"runner lost with {len(held)} jobs under way, back after {self.config.host_down_s:g} s"
        )

    def lose_postgres_primary(self, fault: Fault) -> str:
        with self.target.lock:
            lost = self.cluster.db_primary
            self.target.down.add(lost)
            _, promoted = self.cluster.lose_db_primary()
        fault.measured["promoted_after_s"] = round(time.time() - fault.happened_at, 1)
        probe = self._probe(fault)
        fault.measured["progress_s"] = probe.result()
        # The new primary alone until this returns: nothing else is injected meanwhile.
        alone = time.time()
        self.target.back(lost, self.cluster.rebuild_db)
        fault.measured["new_primary_alone_s"] = round(time.time() - alone, 1)
        return f"{lost} lost, {promoted} promoted; {lost} rebuilt as its synchronous replica"

    def lose_redis_primary(self, fault: Fault) -> str:
        with self.target.lock:
            lost = self.cluster.redis_primary()
            self.target.down.add(lost)
            self.cluster.lose_redis_primary()
        probe = self._probe(fault)
        promoted = self.cluster.redis_promoted(lost)
        fault.measured["promoted_after_s"] = round(time.time() - fault.happened_at, 1)
        fault.measured["progress_s"] = probe.result()
        self.target.back(lost, self.cluster.rejoin_redis)
        return f"{lost} lost, the Sentinels promoted {promoted}; {lost} back as its replica"


# --------------------------------------------------------------------------- report
def fault_lines(report: dict[str, Any]) -> list[str]:
    lines = ["", "| fault | at s | progress again after | more | what |", "|---|---|---|---|---|"]
    for fault in report["faults"]:
        measured = dict(fault["measured"])
        progress = measured.pop("progress_s", None)
        after = "not measured" if progress is None else (
            "NO PROGRESS" if progress < 0 else f"{progress:.1f} s"
        )  # fmt: skip
        more = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in measured.items())
        lines.append(
            f"| {fault['kind']} | {fault['at_s']:.0f} | {after} | {more} | {fault['result']} |"
        )
    if report["probe_errors"]:
        lines += ["", "probe errors:"] + [f"  - {e}" for e in report["probe_errors"]]
    return lines


def run_chaos_net(
    config: NetConfig, directory: Path, keep: bool, log: Any = print
) -> dict[str, Any]:
    rng = random.Random(config.seed)
    net.preflight()  # before anything that a failure would have to remove
    effects: EffectServer | None = None
    try:
        cluster = net.build(directory, NET_SETTINGS)
        effects = EffectServer(net.HARNESS)
        os.environ.update(cluster.app_env())
        import django

        django.setup()
        org_name = f"chaos-net-{config.seed}"
        org = cluster.create_org(org_name, 1_000_000)
        cluster.manage("set_limits", org_name, "--max-running-runs", str(CHAOS_MAX_RUNNING_RUNS),
                       "--max-running-steps", str(NET_MAX_RUNNING_STEPS))  # fmt: skip
        probe_org = cluster.create_org("probe", 1_000_000)
        script = directory / "runner_job.py"
        script.write_text(RUNNER_COMMAND)
        cluster.start_runner(
            org_name, f"{sys.executable} {script}", "--concurrency", "4", "--kill-after", "1",
            env={"ORCH_EFFECT_URL": effects.url, "ORCH_EFFECT_HOLD": str(RUNNER_JOB_S)},
        )  # fmt: skip
        target = ClusterTarget(cluster)
        probe_tally = Tally()
        injectors: list[NetInjector] = []

        def injector_for(book: RunBook, draw: random.Random) -> NetInjector:
            injector = NetInjector(target, config, fault_schedule(config, draw), draw, book,
                                   probe_org["api_key"], probe_tally)  # fmt: skip
            injectors.append(injector)
            return injector

        log(f"==> chaos-net: {config.runs} runs through web1 and web2, {len(FAULT_KINDS)} faults "
            f"(seed {config.seed}); slow effects answer after {SLOW_EFFECT_S:g} s")  # fmt: skip
        report = storm(config, rng, target, effects, org["api_key"], injector_for, log)
        probes = injectors[0].probes
        report["probe_errors"] = [f"{p.run_name}: {p.error}" for p in probes if p.error]
        report["probe_api_server_errors"] = probe_tally.server_errors
        report["directory"] = str(directory)
        report["ok"] = bool(
            report["ok"]
            and not report["probe_errors"]
            and not probe_tally.server_errors
            and all(not f["result"].startswith("not injected") for f in report["faults"])
        )
        report["recovery"] = {f["kind"]: f["measured"] for f in report["faults"]}
        return report
    finally:
        if effects is not None:
            effects.close()
        if not keep:
            net.down(directory)


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m reliability.chaos_net", description=(__doc__ or "").split("\n")[0]
    )
    parser.add_argument("--seed", type=int, default=int(os.environ.get("CHAOS_SEED") or 1))
    parser.add_argument("--runs", type=int, default=int(os.environ.get("CHAOS_RUNS") or 200))
    parser.add_argument("--json", default=os.environ.get("CHAOS_NET_JSON", ""))
    parser.add_argument("--keep", action="store_true",
                        help="leave the cluster up (make cluster-down removes it)")  # fmt: skip
    args = parser.parse_args(argv)
    config = NetConfig(runs=args.runs, seed=args.seed)
    # make cluster's directory: `make cluster-down` removes what --keep left.
    directory = net.DEFAULT_DIR
    try:
        report = run_chaos_net(config, directory, args.keep, log=say)
    except (net.ClusterError, OSError) as exc:
        say(f"chaos-net: FAILED to start: {exc}")
        return 1
    text = format_report(report, title="chaos-net")
    print(text + "\n" + "\n".join(fault_lines(report)))
    if args.json:
        Path(args.json).write_text(
            json.dumps({**report, "config": asdict(config)}, indent=2, default=str)
        )
    if args.keep:
        say(f"\nthe cluster is still up ({directory}): make cluster-down removes it")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
