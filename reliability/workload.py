"""The mixed workload of `make chaos`: plans of every shape, their expected outcomes, and
the side-effect endpoint that records every execution by (step, attempt).

Each kind of plan says which final status it must reach when nobody intervenes; the
harness adds cancellations (which make `cancelled` acceptable) and pauses (which must
not change the outcome). The `effect` steps POST to the harness's own HTTP server with
`${step.id}` and `${step.attempt}`, so a tool that ran twice for the same attempt shows.
"""

from __future__ import annotations

import contextlib
import json
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

# The rate limit the `rate_limited` runs spend (name, units, period): tight enough that
# their steps wait for units while faults strike (docs/rate-limits.md).
RATE_LIMIT = ("chaos-rate", 6, "2s")
# The chaos organization's limits: fewer places and slots than the runs and worker
# processes want, so that admission and slots are exercised under faults.
CHAOS_MAX_RUNNING_RUNS = 25
CHAOS_MAX_RUNNING_STEPS = 3
KINDS = (
    "sequential",
    "parallel",
    "dag",
    "continue",
    "fail",
    "run_retry",
    "task_retry",
    "approval",
    "runner",
    "child",
    "escalate",
    "replan",
    "keyed",
    "rate_limited",
    "timer",
    "cached",
    "worker_tool",
)

# What each kind ends as when no one cancels it.
EXPECTED = {
    "sequential": "completed",
    "parallel": "completed",
    "dag": "completed",
    "continue": "completed",
    "fail": "failed",
    "run_retry": "failed",
    "task_retry": "completed",
    "approval": "completed",
    "runner": "completed",
    "child": "completed",
    # Escalated after its step's budget is spent; on-call resumes it (chaos_clients.approver).
    "escalate": "completed",
    # Its failing agent is run again by the rule planner, and succeeds.
    "replan": "completed",
    # One run per shard at a time (its concurrency key); the others wait their turn.
    "keyed": "completed",
    "rate_limited": "completed",
    # A durable wait between two effects: parked in PostgreSQL, woken by its message.
    "timer": "completed",
    # An effect whose output is cached by shard: the shard's first run calls it, the
    # others take its output (charged nothing, no call).
    "cached": "completed",
    # A step of a tool served by make chaos's `orch worker`, killed with the runner.
    "worker_tool": "completed",
    # make chaos-net's: an effect whose service answers after ~20 s (SLOW_EFFECT_S).
    "slow": "completed",
}
# The kinds of make chaos-net: the same, and runs whose effect takes long, so that a
# worker host is cut off while it holds a lease on an effect that happened.
NET_KINDS = (*(kind for kind in KINDS if kind != "worker_tool"), "slow")  # no orch worker
# How long the slow effect's service takes to answer: longer than a partition of a worker
# host from PostgreSQL lasts with the lease after it, so the attempt run again elsewhere
# is still running when the cut-off one tries to record (which the fencing must refuse).
SLOW_EFFECT_S = 22.0
# Shards of the keyed runs: each key's runs run one at a time (docs/fairness.md).
KEYED_SHARDS = 3

# The command the chaos runner runs for each job (the reference runner, docs/runners.md):
# it posts the job's step and attempt to the effect endpoint, as an `http` effect step
# does, so that a job executed twice for one attempt shows in the same book.
RUNNER_COMMAND = """
import json, os, sys, urllib.request
job = json.load(sys.stdin)
hold = float(os.environ.get("ORCH_EFFECT_HOLD") or 0)  # the remote service taking its time
body = {"run": job["run"], "step": job["step"], "attempt": job["attempt"], "hold": hold}
body = json.dumps(body).encode()
request = urllib.request.Request(
    os.environ["ORCH_EFFECT_URL"], data=body, headers={"Content-Type": "application/json"}
)
urllib.request.urlopen(request, timeout=10 + hold).read()
print(json.dumps({"done": job["id"]}))
"""


# --------------------------------------------------------------------------- side effects
@dataclass
class EffectLog:
    """Every execution the effect endpoint saw, by (step id, attempt)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    seen: Counter[tuple[int, int]] = field(default_factory=Counter)

    def record(self, step: int, attempt: int) -> None:
        with self.lock:
            self.seen[(step, attempt)] += 1

    def snapshot(self) -> Counter[tuple[int, int]]:
        with self.lock:
            return Counter(self.seen)


class EffectServer:
    """A tiny HTTP endpoint: `POST /effect {"step", "attempt"}` -> 200 with the same
    step and attempt in its body (so a step's recorded output says which attempt's
    effect it is). On ``host`` (the loopback; `make chaos-net`'s bridge address); each
    answer is held for the request's ``hold`` seconds and ``hold()`` more after the effect
    is recorded, so that a worker cut off meanwhile holds a lease on an effect that
    happened."""

    def __init__(self, host: str = "127.0.0.1", hold: Callable[[], float] | None = None) -> None:
        self.log = EffectLog()
        log = self.log

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                try:
                    body = json.loads(self.rfile.read(length) or b"{}")
                    step, attempt = int(body["step"]), int(body["attempt"])
                    held = float(body.get("hold") or 0)
                except (ValueError, KeyError, TypeError):
                    self.send_response(400)
                    self.end_headers()
                    return
                log.record(step, attempt)
                held += hold() if hold is not None else 0.0
                if held > 0:
                    time.sleep(held)  # the remote service taking its time to answer
                payload = json.dumps({"ok": True, "step": step, "attempt": attempt}).encode()
                # The caller may be gone by now (its host lost while it waited): the
                # effect happened all the same, and is recorded.
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)

            def log_message(self, format: str, *args: Any) -> None:
                return  # thousands of requests: keep the harness's output readable

        self.host = host
        self.server = ThreadingHTTPServer((host, 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.server.server_address[1]}/effect"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# --------------------------------------------------------------------------- steps
FAST_RETRY = {"max_attempts": 4, "backoff": "fixed", "base_delay_ms": 100}


def effect(name: str, url: str, hold: float = 0.0) -> dict[str, Any]:
    """A POST to the effect endpoint, which answers ``hold`` seconds later."""
    body: dict[str, Any] = {"run": "${run.id}", "step": "${step.id}", "attempt": "${step.attempt}"}
    step: dict[str, Any] = {
        "name": name,
        "tool": "http",
        "params": {"method": "POST", "url": url, "json": body, "timeout": 10},
        "retry": {"max_attempts": 5, "backoff": "fixed", "base_delay_ms": 200},
    }
    if hold:
        body["hold"] = hold
        step["params"]["timeout"] = hold + 10
        step["timeout"] = "2m"
    return step


def flaky(name: str) -> dict[str, Any]:
    """Fails its first attempt with a retryable error, succeeds on the second."""
    return {
        "name": name,
        "tool": "fail",
        "params": {"until_attempt": 1, "code": "transient"},
        "retry": FAST_RETRY,
    }


def broken(name: str) -> dict[str, Any]:
    """Fails for good at once (a non-retryable error)."""
    return {"name": name, "tool": "fail", "params": {"code": "invalid_input"}}


def pause(name: str, seconds: float) -> dict[str, Any]:
    return {"name": name, "tool": "sleep", "params": {"seconds": seconds}}


def noop(name: str) -> dict[str, Any]:
    return {"name": name, "tool": "noop"}


def on_runner(name: str) -> dict[str, Any]:
    """A job for the chaos runner; its attempts are retried when the runner is lost."""
    return {
        "name": name,
        "tool": "runner",
        "params": {"prompt": "chaos job of ${run.id}"},
        "timeout": "2m",
        "retry": {"max_attempts": 8, "backoff": "fixed", "base_delay_ms": 200},
    }


def on_worker(name: str) -> dict[str, Any]:
    """A step of make chaos's worker tool (reliability/chaos_worker_tools.py); its attempts are
    retried when the worker is lost."""
    return {
        "name": name,
        "tool": "chaos.effect",
        "timeout": "2m",
        "retry": {"max_attempts": 8, "backoff": "fixed", "base_delay_ms": 200},
    }


# --------------------------------------------------------------------------- plans
def _run(name: str, agents: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"name": name, "priority": 5, "agents": agents, **extra}


def _agent(tasks: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"name": "agent", "tasks": tasks, **extra}


def plan_for(kind: str, index: int, url: str, rng: random.Random) -> dict[str, Any]:
    """A plan of ``kind``; ``rng`` varies sizes and timings, deterministically per seed."""
    name = f"chaos-{index:04d}-{kind}"
    # Long enough that work is always in flight (and queued) when a fault strikes.
    short = round(rng.uniform(0.3, 1.2), 2)
    if kind == "sequential":
        steps = [effect("e1", url), flaky("flaky"), pause("wait", short), effect("e2", url)]
        steps += [noop(f"n{i}") for i in range(rng.randint(1, 4))]
        return _run(name, [_agent([{"name": "seq", "mode": "sequential", "steps": steps}])])
    if kind == "parallel":
        width = rng.randint(6, 12)
        kinds = (lambda i: effect(f"e{i}", url), lambda i: flaky(f"f{i}"),
                 lambda i: pause(f"w{i}", short))  # fmt: skip
        steps = [kinds[i % 3](i) for i in range(width)]
        task = {"name": "fan", "mode": "parallel", "max_concurrent_steps": 4, "steps": steps}
        return _run(name, [_agent([task])])
    if kind == "dag":
        tasks = [
            {"name": "a", "steps": [effect("e", url), flaky("f")]},
            {"name": "b", "depends_on": ["a"], "steps": [effect("e", url)]},
            {"name": "c", "depends_on": ["a"], "steps": [flaky("f"), pause("w", short)]},
            {"name": "d", "depends_on": ["b", "c"], "steps": [effect("e", url)]},
        ]
        return _run(name, [_agent(tasks, mode="dag", max_concurrent_tasks=2)])
    if kind == "continue":
        task = {
            "name": "tolerant",
            "mode": "parallel",
            "failure_mode": "continue",
            "steps": [effect("e1", url), broken("bad"), effect("e2", url)],
        }
        return _run(name, [_agent([task])])
    if kind == "fail":
        task = {"name": "doomed", "steps": [effect("e1", url), broken("bad"), effect("never", url)]}
        return _run(name, [_agent([task])])
    if kind == "run_retry":
        task = {"name": "doomed", "steps": [effect("e1", url), broken("bad")]}
        return _run(name, [_agent([task])], failure_mode="retry", max_attempts=2)
    if kind == "task_retry":
        retried = {"name": "retried", "failure_mode": "retry", "steps": [broken("bad")]}
        fine = {"name": "fine", "steps": [effect("e1", url), flaky("f")]}
        return _run(name, [_agent([retried, fine], mode="parallel", failure_mode="continue")])
    if kind == "runner":
        steps = [effect("e1", url), on_runner("agent"), effect("e2", url)]
        return _run(name, [_agent([{"name": "remote", "steps": steps}])])
    if kind == "worker_tool":
        steps = [effect("e1", url), on_worker("tool"), effect("e2", url)]
        return _run(name, [_agent([{"name": "hosted", "steps": steps}])])
    if kind == "child":
        # A sync child and an async_callback child, each with effects of its own; the
        # callback's handler runs one more when the child ends.
        inner = _run(f"{name}-child", [_agent([{"name": "inner", "steps": [
            effect("e", url), flaky("f"), pause("w", short),
        ]}])])  # fmt: skip
        handler = [effect("after", url)]
        steps = [
            effect("e1", url),
            {"name": "sync", "tool": "run", "params": {"plan": inner}, "timeout": "2m"},
            {"name": "later", "tool": "run", "on_callback": handler,
             "params": {"plan": inner, "execution_mode": "async_callback"}},
            effect("e2", url),
        ]  # fmt: skip
        return _run(name, [_agent([{"name": "parent", "steps": steps}])])
    if kind == "escalate":
        held = {
            "name": "held",
            "tool": "fail",
            "params": {"until_attempt": 2, "code": "transient"},
            "retry": {**FAST_RETRY, "max_attempts": 2, "on_exhausted": "escalate"},
        }
        steps = [effect("e1", url), held, effect("e2", url)]
        return _run(name, [_agent([{"name": "escalating", "steps": steps}])])
    if kind == "replan":
        once = {
            "name": "once",
            "tool": "fail",
            "params": {"until_attempt": 1, "code": "transient"},
            "retry": {**FAST_RETRY, "max_attempts": 1},
        }
        failing = {"name": "failing", "tasks": [{"name": "t", "steps": [effect("e", url), once]}]}
        steady = {"name": "steady", "tasks": [{"name": "t", "steps": [effect("e", url)]}]}
        return _run(
            name,
            [failing, steady],
            failure_mode="continue",
            replan={"agent_failure_ratio": 0.4, "planner": "rules"},
        )
    if kind == "keyed":
        steps = [effect("e1", url), pause("wait", short), effect("e2", url)]
        return _run(
            name,
            [_agent([{"name": "keyed", "steps": steps}])],
            variables={"shard": index % KEYED_SHARDS},
            concurrency={"key": "chaos-shard-${variables.shard}", "max_runs": 1},
        )
    if kind == "rate_limited":
        # Effects that spend the chaos organization's shared rate limit (storm() declares
        # it), in two keyed buckets: they wait for their units while faults strike.
        uses = [{"name": RATE_LIMIT[0], "key": "tier-${variables.tier}"}]
        steps = [effect(f"e{i}", url) | {"rate_limits": uses} for i in range(rng.randint(3, 8))]
        task = {"name": "limited", "mode": "parallel", "max_concurrent_steps": 4, "steps": steps}
        return _run(name, [_agent([task])], variables={"tier": index % 2})
    if kind == "timer":
        timer = {"name": "timer", "tool": "wait", "params": {"for": f"{rng.randint(1, 4)}s"}}
        steps = [effect("e1", url), timer, effect("e2", url)]
        return _run(name, [_agent([{"name": "timed", "steps": steps}])])
    if kind == "cached":
        cache = {"key": "chaos-cache-${variables.shard}", "ttl": "1h"}
        steps = [effect("e1", url) | {"cache": cache}, noop("after")]
        return _run(
            name,
            [_agent([{"name": "cached", "steps": steps}])],
            variables={"shard": index % KEYED_SHARDS},
        )
    if kind == "slow":
        steps = [effect("slow", url, hold=SLOW_EFFECT_S), effect("after", url)]
        return _run(name, [_agent([{"name": "slow", "steps": steps}])])
    if kind == "approval":
        steps = [effect("e1", url), {"name": "sign-off", "tool": "approval"}, effect("e2", url)]
        return _run(name, [_agent([{"name": "gated", "steps": steps}])])
    raise ValueError(f"unknown kind {kind!r}")
