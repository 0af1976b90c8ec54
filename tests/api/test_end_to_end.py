"""Through HTTP only, against a live server and a real Celery worker: a client creates and
starts a run, follows it to the end, and reads its steps, history and bill."""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import httpx
import pytest

from tests import factories
from tests.support import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def api(live_server: Any) -> Iterator[httpx.Client]:
    _, key = factories.org_with_key()
    with httpx.Client(
        base_url=f"{live_server.url}/api/v1",
        headers={"Authorization": f"Bearer {key}"},
        timeout=10,
    ) as client:
        yield client


def follow(api: httpx.Client, run_id: str, statuses: set[str]) -> dict[str, Any]:
    def reached() -> dict[str, Any] | None:
        body: dict[str, Any] = api.get(f"/runs/{run_id}").json()
        return body if body["status"] in statuses else None

    return wait_until(reached, timeout=60, what=f"run {run_id} to reach {statuses}")


def everything(api: httpx.Client, path: str, **params: Any) -> list[dict[str, Any]]:
    response = api.get(path, params={**params, "page_size": 500})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["next"] is None
    rows: list[dict[str, Any]] = body["results"]
    return rows


def test_a_run_created_and_started_over_http_completes_and_its_books_balance(
    celery_worker: str, api: httpx.Client
) -> None:
    plan = factories.plan(name="e2e", agents=2, tasks=2, steps=3, tool="echo")
    created = api.post(
        "/runs", json={"plan": plan, "start": True}, headers={"Idempotency-Key": "e2e-1"}
    )
    assert created.status_code == 201, created.text
    run_id = created.json()["id"]
    assert created.json()["status"] == "pending"

    done = follow(api, run_id, {"completed", "failed", "cancelled"})

    assert done["status"] == "completed", done["last_error"]
    assert done["progress"] == {"steps_total": 12, "steps_finished": 12, "percent": 100.0}
    assert done["counts"]["steps"] == {"completed": 12}

    steps = everything(api, f"/runs/{run_id}/steps")
    assert len(steps) == 12
    assert {step["status"] for step in steps} == {"completed"}
    assert all(Decimal(step["cost"]) > 0 for step in steps)

    events = everything(api, f"/runs/{run_id}/events")
    assert events[0]["kind"] == "created"
    run_states = [e["to_status"] for e in events if e["entity"] == "run" and e["to_status"]]
    assert run_states == ["pending", "running", "completed"]

    ledger = everything(api, "/billing/ledger", run=run_id)
    totals = {kind: Decimal(0) for kind in ("reserve", "charge", "refund")}
    for entry in ledger:
        totals[entry["type"]] += Decimal(entry["amount"])
    assert totals["charge"] == sum(Decimal(step["cost"]) for step in steps)
    # The attempt's charges as one entry, written when it settled; each step's on its row.
    (charge,) = (entry for entry in ledger if entry["type"] == "charge")
    assert charge["step"] is None
    assert totals["charge"] + totals["refund"] == totals["reserve"]
    credits = {name: Decimal(value) for name, value in done["credits"].items()}
    assert credits["charged"] + credits["refunded"] == credits["reserved"] == totals["reserve"]
    assert credits["held"] == 0

    balance = api.get("/billing/balance").json()
    assert Decimal(balance["available"]) == Decimal(1000) - totals["charge"]
    assert Decimal(balance["reserved"]) == 0

    replay = api.post(
        "/runs", json={"plan": plan, "start": True}, headers={"Idempotency-Key": "e2e-1"}
    )
    assert replay.status_code == 200
    assert replay.headers["Idempotent-Replayed"] == "true"
    assert replay.json()["id"] == run_id


def test_a_run_waiting_for_a_person_is_approved_over_http_and_completes(
    celery_worker: str, api: httpx.Client
) -> None:
    plan = factories.plan(name="sign-off", steps=1, tool="echo")
    plan["agents"][0]["tasks"][0]["steps"].append(factories.step("approve-it", "approval"))
    run_id = api.post("/runs", json={"plan": plan, "start": True}).json()["id"]

    follow(api, run_id, {"waiting_approval"})
    waiting = everything(api, f"/runs/{run_id}/steps", status="waiting_approval")
    decided = api.post(
        f"/runs/{run_id}/approve", json={"step_id": waiting[0]["id"], "comment": "looks right"}
    )
    done = follow(api, run_id, {"completed", "failed", "cancelled"})

    assert decided.status_code == 200, decided.text
    assert decided.json()["steps"] == [waiting[0]["id"]]
    assert done["status"] == "completed", done["last_error"]
    approvals = everything(api, f"/runs/{run_id}/events", kind="approval")
    assert [event["message"] for event in approvals] == ["looks right"]
