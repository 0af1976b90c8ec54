"""What the storm's clients do through the REST API (`make chaos`, `make chaos-net`):
each submitted run (``Submitted``, in the ``RunBook``), created and started, then
cancelled, paused and resumed, retried reusing what completed, or forked, as drawn; the
operator on call who approves and resumes; and the schedule and rate limit the storm
runs beside its runs. Every request goes through ``reliability.client.Client``, with an
Idempotency-Key where a retried POST must not act twice.
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from reliability.client import Client, GaveUp
from reliability.workload import RATE_LIMIT


@dataclass
class Submitted:
    index: int
    kind: str
    control: str  # "", "cancel", "pause", "resume" (retry reusing) or "fork"
    run_id: str = ""
    cancelled: bool = False
    paused: bool = False
    resumed: bool = False  # retried with reuse: completed
    fork_id: str = ""  # the run forked from it
    error: str = ""


@dataclass
class RunBook:
    lock: threading.Lock = field(default_factory=threading.Lock)
    items: list[Submitted] = field(default_factory=list)

    def add(self, item: Submitted) -> None:
        with self.lock:
            self.items.append(item)

    def ids(self) -> list[str]:
        with self.lock:
            return [item.run_id for item in self.items if item.run_id]


# What is done to a run of these kinds once it has ended (``drive``), unless it is
# cancelled or paused instead.
RESUMED_OR_FORKED = {"fail": "resume", "sequential": "fork"}


def _status_of(response: Any) -> str:
    try:
        return str(response.json().get("status", ""))
    except ValueError:
        return ""


def drive(client: Client, item: Submitted, plan: dict[str, Any], rng: random.Random) -> None:
    """Create and start one run, then cancel or pause/resume it as planned."""
    response = client.request(
        "POST", "/api/v1/runs", json={"plan": plan, "start": True},
        idempotency_key=f"chaos-create-{item.index}",
    )  # fmt: skip
    if response.status_code not in (200, 201):
        item.error = f"create: {response.status_code} {response.text[:200]}"
        return
    item.run_id = response.json()["id"]
    path = f"/api/v1/runs/{item.run_id}"
    if item.control == "cancel":
        time.sleep(rng.uniform(0.2, 3.0))  # a person deciding, at some point mid-flight
        answer = client.request(
            "POST", f"{path}/cancel", json={"reason": "chaos: cancelled by a client"},
            idempotency_key=f"chaos-cancel-{item.index}",
        )  # fmt: skip
        item.cancelled = answer.status_code == 200 and _status_of(answer) == "cancelled"
    elif item.control == "pause":
        time.sleep(rng.uniform(0.2, 2.0))
        for attempt in range(10):
            answer = client.request(
                "POST", f"{path}/pause", idempotency_key=f"chaos-pause-{item.index}-{attempt}"
            )
            if answer.status_code == 200:
                item.paused = True
                break
            current = _status_of(client.request("GET", path))
            if current != "pending":
                break  # finished, or waiting for approval: nothing to pause
            time.sleep(0.5)  # the run was still queued: pause once it runs
        if item.paused:
            time.sleep(rng.uniform(0.5, 3.0))
            answer = client.request(
                "POST", f"{path}/resume", idempotency_key=f"chaos-resume-{item.index}"
            )
            if answer.status_code != 200:
                item.error = f"resume: {answer.status_code} {answer.text[:200]}"
    elif item.control in ("resume", "fork"):
        # Once it has ended: retried reusing what completed (its effects must not run
        # again), or forked from its last effect (what comes before it reused).
        if not _ended(client, path):
            item.error = f"{item.control}: the run did not end within {ENDED_WITHIN_S:g} s"
        elif item.control == "resume":
            answer = client.request(
                "POST", f"{path}/retry", json={"reuse": "completed"},
                idempotency_key=f"chaos-retry-{item.index}",
            )  # fmt: skip
            item.resumed = answer.status_code == 200
            if not item.resumed:
                item.error = f"retry: {answer.status_code} {answer.text[:200]}"
        else:
            answer = client.request(
                "POST", f"{path}/fork", json={"from": FORK_FROM},
                idempotency_key=f"chaos-fork-{item.index}",
            )  # fmt: skip
            if answer.status_code in (200, 201):
                item.fork_id = answer.json()["id"]
            else:
                item.error = f"fork: {answer.status_code} {answer.text[:200]}"


# A run to resume or fork must have ended first; it is polled this long at most.
ENDED_WITHIN_S = 300.0
# Where the `sequential` runs are forked: their last effect (reliability.workload).
FORK_FROM = "agent.seq.e2"
ENDED = ("completed", "failed", "cancelled", "timed_out")


def _ended(client: Client, path: str) -> bool:
    deadline = time.monotonic() + ENDED_WITHIN_S
    while time.monotonic() < deadline:
        if _status_of(client.request("GET", path)) in ENDED:
            return True
        time.sleep(0.5)  # a client polling, not synchronisation
    return False


def approver(client: Client, stop: threading.Event) -> None:
    """Approve whatever waits for approval and resume whatever escalated, as an operator
    on call would (docs/escalation.md): the faults are transient, so carrying on is
    right."""
    while not stop.is_set():
        try:
            page = client.request(
                "GET", "/api/v1/runs", params={"status": "waiting_approval", "page_size": 500}
            )
            for run in page.json().get("results", []):
                client.request("POST", f"/api/v1/runs/{run['id']}/approve", json={"comment": "ok"})
            tickets = client.request(
                "GET", "/api/v1/escalations", params={"status": "open", "page_size": 500}
            )
            for ticket in tickets.json().get("results", []):
                client.request(
                    "POST",
                    f"/api/v1/escalations/{ticket['id']}/resolve",
                    json={"action": "resume", "note": "chaos on-call"},
                    idempotency_key=f"chaos-resolve-{ticket['id']}",
                )
        except (GaveUp, ValueError):
            pass
        stop.wait(1.0)


# A schedule through the storm (docs/schedules.md): a run every SCHEDULE_EVERY, overlap
# allowed, while faults strike and a second beat runs for part of it (Config.second_beat):
# exactly one run per due time, each ending like any other run.
SCHEDULE_EVERY = "5s"


def create_schedule(client: Client, url: str) -> str:
    plan = {
        "name": "scheduled-in-the-storm",  # not "chaos-": runs_in_database counts those
        "agents": [{"name": "a", "tasks": [{"name": "t", "steps": [
            {"name": "wait", "tool": "sleep", "params": {"seconds": 0.3}},
            {"name": "n", "tool": "noop"},
        ]}]}],
    }  # fmt: skip
    body = {"name": "chaos", "plan": plan, "interval": SCHEDULE_EVERY, "overlap": "allow"}
    answer = client.request("POST", "/api/v1/schedules", json=body)
    client.close()
    if answer.status_code != 201:
        raise RuntimeError(f"could not create the schedule: {answer.status_code} {answer.text}")
    return str(answer.json()["id"])


def pause_schedule(client: Client, schedule_id: str) -> None:
    answer = client.request("POST", f"/api/v1/schedules/{schedule_id}/pause")
    client.close()
    if answer.status_code != 200:
        raise RuntimeError(f"could not pause the schedule: {answer.status_code} {answer.text}")


def declare_rate_limit(client: Client) -> None:
    name, most, period = RATE_LIMIT
    answer = client.request(
        "PUT", f"/api/v1/rate-limits/{name}", json={"limit": most, "period": period}
    )
    if answer.status_code not in (200, 201):
        raise RuntimeError(
            f"could not declare rate limit {name}: {answer.status_code} {answer.text}"
        )
    client.close()
