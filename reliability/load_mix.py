"""What the simulated clients of `make load` send, and what each answer must be.

Pure data and bookkeeping, no locust and no Django: the locust users
(``reliability.load_users``) and the report (``reliability.load``) share it, and the unit
tests import it without gevent's monkey-patching.

Every request has a label (the route template, ``GET /runs/{id}``) and a set of statuses
that count as correct; a bad request has a kind (``oversized_body``...) and the one status
the API documents for it (docs/api.md). Anything else is unexpected and fails the run.
"""

from __future__ import annotations

import json
import random
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

# Paths; requests are named by route template under API (``/runs/{id}``), so that one
# row of the report gathers every run id.
API = "/api/v1"
RUNS = f"{API}/runs"

# The floor's route: served only by the load stack's URLconf (reliability/floor.py).
FLOOR = f"{API}/load-floor"

# The phases of `make load`, in order. The floor, the reads and the saturated mix send
# each request as soon as the last one answered (no think time): they measure how many
# requests/s the server can answer, the saturated mix with the mix's own weights. The
# mix keeps the think time it always had, so that its figures stay comparable from round
# to round: it is the realistic latency figure (its p95), not a throughput one, since
# that think time alone caps it at users / 0.5 s (100 requests/s for 50 users) however
# fast the server answers, a ceiling the report shows.
PHASES = ("floor", "reads", "mix_saturated", "mix")
THINK_TIME_S: dict[str, tuple[float, float]] = {
    "floor": (0.0, 0.0),
    "reads": (0.0, 0.0),
    "mix_saturated": (0.0, 0.0),
    "mix": (0.1, 0.9),
}
# Runs each organization creates through the API before the floor, for the reads phase
# to read: every tenth is cancelled before it starts, the others complete.
SEED_RUNS_PER_ORG = 50
SEED_CANCEL_EVERY = 10
# What the reads phase lists: the statuses the seeded runs end in, so every page is full.
READ_STATUSES: tuple[tuple[str, ...], ...] = (
    ("completed",),
    ("cancelled",),
    ("completed", "cancelled"),
)

# How many unexpected answers the report quotes (all of them are counted).
UNEXPECTED_SAMPLES = 50

# Bodies over API_MAX_BODY_BYTES (2,000,000 by default) must answer 413.
OVERSIZED_BYTES = 2_100_000


@dataclass(frozen=True)
class BadKind:
    """A hostile or broken request and the answer docs/api.md promises for it."""

    method: str
    route: str
    status: int
    code: str
    what: str


BAD_KINDS: dict[str, BadKind] = {
    "invalid_plan": BadKind("POST", "/runs", 400, "invalid_plan", "a plan with a problem"),
    "malformed_json": BadKind("POST", "/runs", 400, "invalid_json", "a body cut mid-JSON"),
    "oversized_body": BadKind(
        "POST", "/runs", 413, "payload_too_large", f"a {OVERSIZED_BYTES:,}-byte body"
    ),
    "unknown_key": BadKind(
        "GET", "/runs", 401, "authentication_failed", "a well-formed key nobody issued"
    ),
    "malformed_key": BadKind("GET", "/runs", 401, "authentication_failed", "not a key at all"),
    "revoked_key": BadKind("GET", "/runs", 401, "authentication_failed", "a revoked key"),
    "no_key": BadKind("GET", "/runs", 401, "not_authenticated", "no Authorization header"),
    "read_scope_write": BadKind(
        "POST", "/runs", 403, "insufficient_scope", "a read-only key creating a run"
    ),
    "other_tenant_get": BadKind("GET", "/runs/{id}", 404, "not_found", "another org's run"),
    "other_tenant_cancel": BadKind(
        "POST", "/runs/{id}/cancel", 404, "not_found", "cancelling another org's run"
    ),
    "unknown_run": BadKind("GET", "/runs/{id}", 404, "not_found", "a run id that never existed"),
    "key_reused": BadKind(
        "POST", "/runs", 422, "idempotency_key_reused", "an Idempotency-Key with another body"
    ),
    "unknown_filter": BadKind(
        "GET", "/runs", 400, "invalid_request", "a misspelt filter (?stauts=)"
    ),
}


# --------------------------------------------------------------------------- plans
def _step(rng: random.Random, name: str) -> dict[str, Any]:
    kind = rng.choice(("noop", "echo", "sleep"))
    if kind == "echo":
        return {"name": name, "tool": "echo", "params": {"text": f"hello from {name}"}}
    if kind == "sleep":
        return {"name": name, "tool": "sleep", "params": {"seconds": 0.05}}
    return {"name": name, "tool": "noop"}


def good_plan(rng: random.Random, name: str, slow: bool = False) -> dict[str, Any]:
    """A small plan (1 to 4 cheap steps): sequential, parallel, or two parallel tasks.

    Small on purpose: the workers share two cores with the web server, and every run
    created under load must still end within the settle timeout. A ``slow`` plan adds a
    1.5 s sleep, so that a cancel sent right after the start lands mid-flight.
    """
    shape = rng.choice(("sequential", "parallel", "two_tasks"))
    steps = [_step(rng, f"s{i}") for i in range(rng.randint(1, 4))]
    if slow:
        steps.append({"name": "slow", "tool": "sleep", "params": {"seconds": 1.5}})
    if shape == "sequential":
        agent = {"name": "a", "tasks": [{"name": "t", "steps": steps}]}
    elif shape == "parallel":
        agent = {"name": "a", "tasks": [{"name": "t", "mode": "parallel", "steps": steps}]}
    else:
        tasks = [{"name": "t1", "steps": steps[:1]}, {"name": "t2", "steps": steps[1:] or steps}]
        agent = {"name": "a", "mode": "parallel", "tasks": tasks}
    return {"name": name, "priority": rng.randint(0, 9), "agents": [agent]}


def invalid_plan(rng: random.Random, name: str) -> dict[str, Any]:
    """A plan the validator must refuse (400 invalid_plan), one of several mistakes."""
    plan = good_plan(rng, name)
    task = plan["agents"][0]["tasks"][0]
    mistake = rng.choice(("unknown_tool", "no_steps", "negative_sleep", "depends_on"))
    if mistake == "unknown_tool":
        task["steps"][0] = {"name": "s0", "tool": "ech"}
    elif mistake == "no_steps":
        task["steps"] = []
    elif mistake == "negative_sleep":
        task["steps"][0] = {"name": "s0", "tool": "sleep", "params": {"seconds": -1}}
    else:
        task["depends_on"] = ["nowhere"]  # needs mode 'dag', and names no task
    return plan


def oversized_body() -> str:
    """Valid JSON just over the body limit: only its size is wrong."""
    padding = "x" * (OVERSIZED_BYTES - 100)
    body = {"plan": {"name": "too-big", "variables": {"pad": padding}, "agents": []}}
    return json.dumps(body)


def list_query(rng: random.Random) -> dict[str, Any]:
    """Filters and orderings a dashboard would use (docs/api.md, lists)."""
    query: dict[str, Any] = {"page_size": rng.choice((10, 20, 50))}
    draw = rng.random()
    if draw < 0.3:
        query["status"] = rng.sample(["pending", "running", "completed", "cancelled"], 2)
    elif draw < 0.5:
        query["name"] = "load-"
    elif draw < 0.6:
        query["priority"] = rng.randint(0, 9)
    query["ordering"] = rng.choice(("-created_at", "created_at", "-priority", "status"))
    return query


# --------------------------------------------------------------------------- tally
@dataclass
class Recorder:
    """Every answer the simulated clients got, by label and by bad kind (thread-safe)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    statuses: dict[str, Counter[int]] = field(default_factory=dict)
    bad: dict[str, Counter[int]] = field(default_factory=dict)
    unexpected: int = 0
    samples: list[str] = field(default_factory=list)
    replays: Counter[str] = field(default_factory=Counter)
    runs: dict[str, str] = field(default_factory=dict)  # run id -> organization

    def saw(
        self, label: str, status: int, allowed: frozenset[int], body: str, kind: str = ""
    ) -> bool:
        """Count the answer; False (and a sample kept) when ``status`` is not allowed."""
        with self.lock:
            self.statuses.setdefault(label, Counter())[status] += 1
            if kind:
                self.bad.setdefault(kind, Counter())[status] += 1
            if status in allowed:
                return True
            self._unexpected(f"{label}{f' [{kind}]' if kind else ''} -> {status}: {body[:200]}")
            return False

    def problem(self, text: str) -> None:
        """A wrong answer with an allowed status (a replay without its header...)."""
        with self.lock:
            self._unexpected(text)

    def _unexpected(self, text: str) -> None:
        self.unexpected += 1
        if len(self.samples) < UNEXPECTED_SAMPLES:
            self.samples.append(text)

    def created(self, run_id: str, organization: str) -> None:
        with self.lock:
            self.runs[run_id] = organization

    def replay(self, outcome: str) -> None:
        with self.lock:
            self.replays[outcome] += 1

    def as_dict(self) -> dict[str, Any]:
        with self.lock:
            return {
                "statuses": {
                    label: {str(k): v for k, v in sorted(c.items())}
                    for label, c in sorted(self.statuses.items())
                },
                "bad_requests": {
                    kind: {str(k): v for k, v in sorted(c.items())}
                    for kind, c in sorted(self.bad.items())
                },
                "unexpected": self.unexpected,
                "unexpected_samples": list(self.samples),
                "replays": dict(self.replays),
                "runs": dict(self.runs),
            }
