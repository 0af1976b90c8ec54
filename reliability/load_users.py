"""The locust phase of `make load`, in its own process: ``python -m reliability.load_users
--config CONFIG.json --out STATS.json``.

Importing locust monkey-patches the standard library with gevent, which Django's ORM and
the harness's threads must never see; so ``reliability.load`` (the parent) starts the
stack and checks the database, and only this child imports locust. It reads the target
and the API keys from ``--config``, runs the users headless for the configured time, and
writes locust's statistics and what every answer was to ``--out``.

The config's ``phase`` picks the users (``reliability.load_mix.PHASES``), one phase per
child process. Each simulated user has its own API key (the throttle is per key, so the
default rate of `API_THROTTLE_RATE` holds unchanged):

- ``floor``: ``GET /api/v1/load-floor`` over and over (reliability/floor.py): one row
  read through authentication and DRF, nothing of the API's own logic;
- ``reads``: ``GET /runs/{id}`` and ``GET /runs?status=...`` of the runs the harness
  created for the user's organization before the phases;
- ``mix``: a weighted mix of tasks: create runs with an Idempotency-Key (sometimes
  replaying it), start, poll, list, cancel and delete them, read the balance, and now and
  then send a bad request of a kind from ``reliability.load_mix.BAD_KINDS``;
- ``mix_saturated``: the same tasks in the same proportions, without the think time.

Expected 4xx answers count as successes in locust; any other status is a failure and is
kept as a sample.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import gevent
import gevent.event
from locust import FastHttpUser, User, between, task
from locust.env import Environment
from locust.stats import StatsEntry

from reliability.load_mix import (
    API,
    BAD_KINDS,
    FLOOR,
    READ_STATUSES,
    RUNS,
    THINK_TIME_S,
    Recorder,
    good_plan,
    invalid_plan,
    list_query,
    oversized_body,
)

RECORDER = Recorder()
# Filled by main() before any user starts; the users read it in on_start.
CONFIG: dict[str, Any] = {}
_user_numbers = itertools.count()
_oversized: list[str] = []  # built once: 2 MB of padding per request would cost CPU
OWN_KEY = "own"  # call(key=OWN_KEY): the user's own key; None: no Authorization header


@dataclass
class Answer:
    status: int
    data: Any
    headers: dict[str, str]


def _parse(text: str | None) -> Any:
    try:
        return json.loads(text or "null")
    except ValueError:
        return None


class ApiUser(FastHttpUser):
    """One API client of one organization, with its own key; the phases' users add their
    tasks."""

    abstract = True
    network_timeout = 30.0
    connection_timeout = 10.0

    def on_start(self) -> None:
        self.number = next(_user_numbers)
        orgs = CONFIG["orgs"]
        self.org = orgs[self.number % len(orgs)]
        keys = self.org["keys"]
        self.key: str = keys[(self.number // len(orgs)) % len(keys)]
        self.rng = random.Random(CONFIG["seed"] * 10_000 + self.number)

    # ------------------------------------------------------------------ plumbing
    def call(
        self,
        method: str,
        path: str,
        route: str,
        allowed: frozenset[int],
        *,
        key: str | None = OWN_KEY,
        body: Any = None,
        raw: str | None = None,
        idempotency_key: str | None = None,
        kind: str = "",
    ) -> Answer:
        """One request, named by its ``route`` template in locust's stats; ``allowed`` are
        its correct statuses (a bad request's kind goes in the name too, so its latency and
        statuses stay apart from the good requests to the same route)."""
        headers = {"Accept": "application/json"}
        if key is not None:
            headers["Authorization"] = f"Bearer {self.key if key == OWN_KEY else key}"
        if idempotency_key is not None:
            headers["Idempotency-Key"] = idempotency_key
        data = raw
        if body is not None:
            data = json.dumps(body)
        if data is not None:
            headers["Content-Type"] = "application/json"
        name = f"{route} [{kind}]" if kind else route
        with self.client.request(
            method, path, name=name, data=data, headers=headers, catch_response=True
        ) as response:
            status = response.status_code or 0
            text = (response.text or "") if status else repr(getattr(response, "error", ""))
            if RECORDER.saw(f"{method} {name}", status, allowed, text, kind):
                response.success()
            else:
                response.failure(f"unexpected {status}: {text[:200]}")
            answer_headers = {k.lower(): v for k, v in (response.headers or {}).items()}
        return Answer(status, _parse(text) if status else None, answer_headers)

    def _expect_code(self, answer: Answer, code: str, what: str) -> None:
        got = answer.data.get("code") if isinstance(answer.data, dict) else None
        if got != code:
            RECORDER.problem(f"{what}: {answer.status} with code {got!r}, expected {code!r}")


class FloorUser(ApiUser):
    """The floor: one authenticated read of one row, as fast as the server answers."""

    wait_time = between(*THINK_TIME_S["floor"])

    @task
    def floor(self) -> None:
        self.call("GET", FLOOR, "/load-floor", frozenset({200}))


class ReadsUser(ApiUser):
    """The reads: a run, and runs by status, of the runs seeded for this organization;
    polls and lists weighted as in the mix."""

    wait_time = between(*THINK_TIME_S["reads"])

    @task(10)
    def poll(self) -> None:
        run_id = self.rng.choice(self.org["runs"])
        self.call("GET", f"{RUNS}/{run_id}", "/runs/{id}", frozenset({200}))

    @task(6)
    def list_runs(self) -> None:
        query = urlencode({"status": self.rng.choice(READ_STATUSES)}, doseq=True)
        self.call("GET", f"{RUNS}?{query}", "/runs", frozenset({200}))


class MixUser(ApiUser):
    """The mix: every kind of request a client sends, bad ones included."""

    wait_time = between(*THINK_TIME_S["mix"])

    def on_start(self) -> None:
        super().on_start()
        self.mine: list[str] = []  # this user's recent runs, newest last
        self.sequence = 0
        self.last_create: tuple[str, dict[str, Any]] | None = None

    def _recent(self) -> str | None:
        return self.rng.choice(self.mine) if self.mine else None

    def _remember(self, run_id: str) -> None:
        RECORDER.created(run_id, self.org["name"])
        self.mine = [*self.mine[-19:], run_id]

    def _create(self, *, start: bool, slow: bool = False) -> str | None:
        self.sequence += 1
        name = f"load-{self.org['name']}-u{self.number}-{self.sequence}"
        body = {"plan": good_plan(self.rng, name, slow), "start": start}
        key = uuid.uuid4().hex
        answer = self.call("POST", RUNS, "/runs", frozenset({201}), body=body, idempotency_key=key)
        if answer.status != 201 or not isinstance(answer.data, dict):
            return None
        run_id = str(answer.data["id"])
        self._remember(run_id)
        self.last_create = (key, body)
        if self.rng.random() < 0.1:
            self._replay(key, body, run_id)
        return run_id

    def _replay(self, key: str, body: dict[str, Any], run_id: str) -> None:
        """The same key and body again, as a client retrying after a lost answer would:
        200, `Idempotent-Replayed: true`, the same run, nothing created."""
        answer = self.call("POST", RUNS, "/runs", frozenset({200}), body=body, idempotency_key=key)
        if answer.status != 200:
            RECORDER.replay("wrong status")
            return
        replayed = answer.headers.get("idempotent-replayed") == "true"
        same = isinstance(answer.data, dict) and str(answer.data.get("id")) == run_id
        if replayed and same:
            RECORDER.replay("ok")
        else:
            RECORDER.replay("wrong answer")
            RECORDER.problem(f"replay of {run_id}: header {replayed}, same run {same}")

    # ------------------------------------------------------------------ the tasks
    @task(6)
    def create(self) -> None:
        start_now = self.rng.random() < 0.75
        # Some runs are cancelled at once, while pending or running (the cancel task
        # mostly finds runs that have already completed: a 409).
        doomed = self.rng.random() < 0.15
        run_id = self._create(start=start_now, slow=doomed)
        if run_id and not start_now:
            self.call("POST", f"{RUNS}/{run_id}/start", "/runs/{id}/start",
                      frozenset({200}), idempotency_key=uuid.uuid4().hex)  # fmt: skip
        if run_id and doomed:
            self._cancel(run_id)

    @task(10)
    def poll(self) -> None:
        run_id = self._recent()
        if run_id:
            self.call("GET", f"{RUNS}/{run_id}", "/runs/{id}", frozenset({200}))

    @task(2)
    def history(self) -> None:
        run_id = self._recent()
        if run_id:
            part = self.rng.choice(("events", "steps"))
            self.call("GET", f"{RUNS}/{run_id}/{part}", f"/runs/{{id}}/{part}", frozenset({200}))

    @task(6)
    def list_runs(self) -> None:
        query = urlencode(list_query(self.rng), doseq=True)
        self.call("GET", f"{RUNS}?{query}", "/runs", frozenset({200}))

    @task(2)
    def cancel(self) -> None:
        run_id = self._recent()
        if run_id:
            self._cancel(run_id)

    def _cancel(self, run_id: str) -> None:
        # 409 invalid_transition when the run had already completed: a correct answer.
        answer = self.call("POST", f"{RUNS}/{run_id}/cancel", "/runs/{id}/cancel",
                           frozenset({200, 409}), body={"reason": "load test"},
                           idempotency_key=uuid.uuid4().hex)  # fmt: skip
        if answer.status == 409:
            self._expect_code(answer, "invalid_transition", f"cancel {run_id}")

    @task(1)
    def delete(self) -> None:
        run_id = self._create(start=False)
        if run_id:
            self.call("DELETE", f"{RUNS}/{run_id}", "/runs/{id}", frozenset({204}))

    @task(1)
    def balance(self) -> None:
        self.call("GET", f"{API}/billing/balance", "/billing/balance", frozenset({200}))

    @task(6)
    def bad_request(self) -> None:
        kind = self.rng.choice(sorted(BAD_KINDS))
        expected = BAD_KINDS[kind]
        path, key, body, raw, idem = self._bad(kind)
        answer = self.call(expected.method, path, expected.route, frozenset({expected.status}),
                           key=key, body=body, raw=raw, idempotency_key=idem,
                           kind=kind)  # fmt: skip
        if answer.status == expected.status:
            self._expect_code(answer, expected.code, kind)

    def _bad(
        self, kind: str
    ) -> tuple[str, str | None, dict[str, Any] | None, str | None, str | None]:
        """Path, key, JSON body, raw body and Idempotency-Key of a bad request."""
        fresh = uuid.uuid4().hex
        plan: dict[str, Any] = {"plan": good_plan(self.rng, "load-refused"), "start": True}
        if kind == "invalid_plan":
            return RUNS, OWN_KEY, {"plan": invalid_plan(self.rng, "load-bad")}, None, fresh
        if kind == "malformed_json":
            return RUNS, OWN_KEY, None, '{"plan": {"name": "cut", "agents": [', fresh
        if kind == "oversized_body":
            if not _oversized:
                _oversized.append(oversized_body())
            return RUNS, OWN_KEY, None, _oversized[0], fresh
        if kind == "unknown_key":
            return RUNS, f"ork_{uuid.uuid4().hex[:8]}_{uuid.uuid4().hex}", None, None, None
        if kind == "malformed_key":
            return RUNS, "not-a-key", None, None, None
        if kind == "revoked_key":
            return RUNS, self.org["revoked_key"], None, None, None
        if kind == "no_key":
            return RUNS, None, None, None, None
        if kind == "read_scope_write":
            return RUNS, self.org["read_key"], plan, None, fresh
        if kind in ("other_tenant_get", "other_tenant_cancel"):
            theirs = self._someone_elses_run()
            suffix = "/cancel" if kind == "other_tenant_cancel" else ""
            return f"{RUNS}/{theirs}{suffix}", OWN_KEY, None, None, fresh if suffix else None
        if kind == "unknown_run":
            return f"{RUNS}/{uuid.uuid4()}", OWN_KEY, None, None, None
        if kind == "key_reused":
            if self.last_create is None:
                self._create(start=True)
            key, body = self.last_create or (fresh, plan)
            changed = {**body, "plan": {**body["plan"], "name": "load-changed-body"}}
            return RUNS, OWN_KEY, changed, None, key
        if kind == "unknown_filter":
            return f"{RUNS}?stauts=running", OWN_KEY, None, None, None
        raise ValueError(f"unknown bad request kind {kind!r}")

    def _someone_elses_run(self) -> str:
        """A run id of another organization, or a random one before any exists."""
        with RECORDER.lock:
            theirs = [rid for rid, org in RECORDER.runs.items() if org != self.org["name"]]
        return self.rng.choice(theirs[-200:]) if theirs else str(uuid.uuid4())


class MixSaturatedUser(MixUser):
    """The mix's requests in the mix's proportions, each sent as soon as the last one
    answered: what the server can answer of the whole mix."""

    wait_time = between(*THINK_TIME_S["mix_saturated"])


# --------------------------------------------------------------------------- main
def entry(stats: StatsEntry, seconds: float) -> dict[str, Any]:
    """One row of locust's statistics, with the percentiles the report shows."""
    return {
        "method": stats.method,
        "name": stats.name,
        "requests": stats.num_requests,
        "failures": stats.num_failures,
        "rps": stats.num_requests / seconds if seconds > 0 else 0.0,
        "avg_ms": stats.avg_response_time,
        "p50_ms": stats.get_response_time_percentile(0.5),
        "p95_ms": stats.get_response_time_percentile(0.95),
        "p99_ms": stats.get_response_time_percentile(0.99),
        "max_ms": stats.max_response_time,
    }


USERS: dict[str, type[User]] = {
    "floor": FloorUser,
    "reads": ReadsUser,
    "mix_saturated": MixSaturatedUser,
    "mix": MixUser,
}


def run(config: dict[str, Any]) -> dict[str, Any]:
    CONFIG.update(config)
    environment = Environment(
        user_classes=[USERS[config["phase"]]],
        host=config["host"],
        stop_timeout=float(config["stop_timeout"]),
        catch_exceptions=True,
    )
    runner = environment.create_local_runner()
    spawned = gevent.event.Event()
    peak: list[int] = []

    def on_spawned(user_count: int, **_: Any) -> None:
        peak.append(user_count)
        spawned.set()

    # EventHook.add_listener is untyped in locust 2.47.
    environment.events.spawning_complete.add_listener(on_spawned)  # type: ignore[no-untyped-call]
    started = time.time()
    runner.start(config["users"], spawn_rate=config["spawn_rate"])
    spawned.wait(timeout=config["users"] / config["spawn_rate"] + 30)
    all_in = time.time()
    gevent.sleep(config["seconds"])  # the measured window, every user running
    runner.stop()  # each user finishes its current task (up to stop_timeout), then stops
    stopped = time.time()
    seconds = stopped - started
    stats = environment.stats
    rows = sorted(stats.entries.values(), key=lambda e: (e.name, e.method))
    exceptions = [
        {"count": e["count"], "msg": e["msg"], "traceback": e["traceback"][-1500:]}
        for e in runner.exceptions.values()
    ]
    report = {
        "phase": config["phase"],
        "users": config["users"],
        "peak_users": max(peak, default=0),
        "ramp_s": all_in - started,
        "window_s": stopped - all_in,
        "duration_s": seconds,
        "started_at": started,
        "endpoints": [entry(e, seconds) for e in rows],
        "total": entry(stats.total, seconds),
        "locust_errors": [
            {"method": e.method, "name": e.name, "error": str(e.error), "count": e.occurrences}
            for e in stats.errors.values()
        ],
        "user_exceptions": exceptions,
        **RECORDER.as_dict(),
    }
    runner.quit()
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reliability.load_users")
    parser.add_argument("--config", required=True, help="JSON written by reliability.load")
    parser.add_argument("--out", required=True, help="where to write the statistics (JSON)")
    args = parser.parse_args(argv)
    report = run(json.loads(Path(args.config).read_text()))
    Path(args.out).write_text(json.dumps(report, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
