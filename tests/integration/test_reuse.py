"""Steps completed without running, on a real worker: a retry that reuses what its attempt
completed, a fork from a step, a step cache (docs/engine.md, "Steps completed without
running"). The side effects are calls to a loopback HTTP server, counted."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from rest_framework.test import APIClient

from billing.models import LedgerEntry, Organization
from billing.services import api_key_create
from runs import services
from runs.admin.run_page.layout import run_graph
from runs.admin.run_page.svg import graph_svg
from runs.models import Run, RunAttempt, Step
from runs.people import approvals
from runs.selectors import run_history
from tests import factories
from tests.http_fixture import HttpServer
from tests.integration.engine_support import assert_books_balanced, steps_of, submit, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

ONCE = {"max_attempts": 1}


def client_of(organization: Organization) -> APIClient:
    _, key = api_key_create(organization=organization)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    return client


def five_steps(url: str) -> dict[str, Any]:
    """Five steps in sequence: two calls, a call that fails the first time, and two steps
    that read the first two's outputs (a template, a condition)."""
    return {
        "name": "five",
        "agents": [
            {
                "name": "a",
                "tasks": [
                    {
                        "name": "t",
                        "steps": [
                            factories.step("one", "http", params={"url": f"{url}/one"}),
                            factories.step("two", "http", params={"url": f"{url}/two"}),
                            factories.step(
                                "three", "http", params={"url": f"{url}/three"}, retry=ONCE
                            ),
                            factories.step(
                                "four", "echo", params={"first": "${steps.one.output.body.n}"}
                            ),
                            factories.step(
                                "five",
                                "echo",
                                params={"second": "${steps.two.output.body.n}"},
                                when="${steps.two.output.body.n} == 2",
                            ),
                        ],
                    }
                ],
            }
        ],
    }


def calls(server: HttpServer, path: str) -> int:
    return sum(1 for request in server.requests if request.path == path)


def test_a_retry_with_reuse_runs_only_what_did_not_complete(
    celery_worker: str, http_server: HttpServer
) -> None:
    http_server.respond("/one", json={"n": 1})
    http_server.respond("/two", json={"n": 2})
    http_server.respond("/three", status=404, times=1)
    http_server.respond("/three", json={"n": 3})
    organization = factories.org(credits=100)
    run = submit(five_steps(http_server.url), organization=organization)
    assert wait_for(run).status == "failed"
    first = steps_of(run)

    client = client_of(organization)
    refused = client.post(f"/api/v1/runs/{run.pk}/retry", {"reuse": "some"}, format="json")
    assert refused.status_code == 400, refused.json()
    assert refused.json()["code"] == "invalid_request"
    answer = client.post(f"/api/v1/runs/{run.pk}/retry", {"reuse": "completed"}, format="json")
    assert answer.status_code == 200, answer.json()
    done = wait_for(run)

    assert done.status == "completed", done.last_error
    assert (calls(http_server, "/one"), calls(http_server, "/two")) == (1, 1)
    assert calls(http_server, "/three") == 2
    second = steps_of(run)
    assert second["one"].reused_from == {"attempt": 1, "step": first["one"].pk}
    assert second["two"].reused_from == {"attempt": 1, "step": first["two"].pk}
    assert second["one"].output == first["one"].output
    assert second["three"].reused_from is None
    assert second["four"].output == {"first": 1}
    assert second["five"].status == "completed"
    assert second["five"].output == {"second": 2}
    # Charged once per executed attempt (its cost on its row): nothing for the reused
    # steps.
    charged = set(Step.objects.filter(run=run, cost__gt=0).values_list("pk", flat=True))
    assert charged == {
        first["one"].pk,
        first["two"].pk,
        first["three"].pk,
        second["three"].pk,
        second["four"].pk,
        second["five"].pk,
    }
    assert (second["one"].cost, second["two"].cost) == (Decimal(0), Decimal(0))
    # The reservation covers only what runs: the two reused calls (3 tries of 0.10 each)
    # are left out.
    reservations = [
        a.reservation.reserved
        for a in RunAttempt.objects.filter(run=run).order_by("attempt_number")
    ]
    assert reservations[0] - reservations[1] == Decimal("0.60")
    events = run_history(run).filter(kind="reuse", attempt_number=2)
    assert sorted(int(e.entity_id) for e in events) == [second["one"].pk, second["two"].pk]
    steps = client.get(f"/api/v1/runs/{run.pk}/steps").json()["results"]
    shown = {row["name"]: row["reused_from"] for row in steps}
    assert shown["one"] == {"attempt": 1, "step": first["one"].pk}
    assert shown["three"] is None
    # The operators' run page marks them.
    drawn = str(graph_svg(run_graph(done)))
    assert drawn.count('class="node step st-completed reused"') == 2
    assert_books_balanced(run)


def test_a_retry_without_reuse_runs_every_step_again(
    celery_worker: str, http_server: HttpServer
) -> None:
    http_server.respond("/one", json={"n": 1})
    http_server.respond("/two", json={"n": 2})
    http_server.respond("/three", status=404, times=1)
    http_server.respond("/three", json={"n": 3})
    organization = factories.org(credits=100)
    run = submit(five_steps(http_server.url), organization=organization)
    assert wait_for(run).status == "failed"

    answer = client_of(organization).post(f"/api/v1/runs/{run.pk}/retry", {}, format="json")
    assert answer.status_code == 200, answer.json()

    assert wait_for(run).status == "completed"
    assert (calls(http_server, "/one"), calls(http_server, "/two")) == (2, 2)
    assert not Step.objects.filter(run=run).exclude(reused_from=None).exists()
    assert_books_balanced(run)


def test_a_fork_with_an_edited_plan_runs_only_from_its_step_on(
    celery_worker: str, http_server: HttpServer
) -> None:
    http_server.respond("/one", json={"n": 1})
    http_server.respond("/two", json={"n": 2})
    http_server.respond("/three", status=404, times=1)
    http_server.respond("/three", json={"n": 3})
    organization = factories.org(credits=100)
    source = submit(five_steps(http_server.url), organization=organization)
    assert wait_for(source).status == "failed"
    before = steps_of(source)
    client = client_of(organization)
    edited = five_steps(http_server.url)
    steps = edited["agents"][0]["tasks"][0]["steps"]
    steps[3]["params"]["edited"] = True  # at or after `from`: free to change
    steps.append(factories.step("six", "echo", params={"three": "${steps.three.output.body.n}"}))

    preview = client.post(
        f"/api/v1/runs/{source.pk}/fork",
        {"from": "a.t.three", "plan": edited, "dry_run": True},
        format="json",
    )
    assert preview.status_code == 200, preview.json()
    assert preview.json()["reuse"] == ["a.t.one", "a.t.two"]
    assert preview.json()["run"] == ["a.t.three", "a.t.four", "a.t.five", "a.t.six"]
    changed = five_steps(http_server.url)
    changed["agents"][0]["tasks"][0]["steps"][0]["params"]["url"] += "?v=2"
    refused = client.post(
        f"/api/v1/runs/{source.pk}/fork", {"from": "a.t.three", "plan": changed}, format="json"
    )
    assert refused.status_code == 400
    assert refused.json()["code"] == "invalid_fork"
    assert refused.json()["details"] == {"paths": ["a.t.one"]}
    # A step it would reuse reads a variable the fork changes: its output would differ.
    reads = five_steps(http_server.url)
    reads["variables"] = {"v": 1}
    reads["agents"][0]["tasks"][0]["steps"][0]["params"]["url"] += "?v=${variables.v}"
    Run.objects.filter(pk=source.pk).update(plan=reads, variables={"v": 1})
    moved = client.post(
        f"/api/v1/runs/{source.pk}/fork",
        {"from": "a.t.three", "variables": {"v": 2}, "dry_run": True},
        format="json",
    )
    assert (moved.status_code, moved.json()["details"]) == (400, {"paths": ["a.t.one"]})
    kept = client.post(
        f"/api/v1/runs/{source.pk}/fork",
        {"from": "a.t.three", "variables": {"v": 1}, "dry_run": True},
        format="json",
    )
    assert kept.status_code == 200, kept.json()
    Run.objects.filter(pk=source.pk).update(plan=five_steps(http_server.url), variables={})
    unknown = client.post(f"/api/v1/runs/{source.pk}/fork", {"from": "a.t.nine"}, format="json")
    assert (unknown.status_code, unknown.json()["code"]) == (400, "invalid_fork")

    body = {"from": "a.t.three", "plan": edited}
    answer = client.post(
        f"/api/v1/runs/{source.pk}/fork", body, format="json", headers={"Idempotency-Key": "f1"}
    )
    assert answer.status_code == 201, answer.json()
    fork = answer.json()
    assert fork["forked_from"] == {"run": str(source.pk), "step": "a.t.three"}
    again = client.post(
        f"/api/v1/runs/{source.pk}/fork", body, format="json", headers={"Idempotency-Key": "f1"}
    )
    assert again.json()["id"] == fork["id"]
    forked = wait_for(type(source).objects.get(pk=fork["id"]))

    assert forked.status == "completed", forked.last_error
    assert (calls(http_server, "/one"), calls(http_server, "/two")) == (1, 1)
    assert calls(http_server, "/three") == 2
    after = steps_of(forked)
    assert after["one"].reused_from == {"attempt": 1, "step": before["one"].pk}
    assert after["two"].reused_from == {"attempt": 1, "step": before["two"].pk}
    assert after["four"].output == {"first": 1, "edited": True}
    assert after["six"].output == {"three": 3}
    charged = set(Step.objects.filter(run=forked, cost__gt=0).values_list("pk", flat=True))
    assert charged == {after[name].pk for name in ("three", "four", "five", "six")}
    listed = client.get(f"/api/v1/runs/{source.pk}").json()
    assert listed["forks"] == [fork["id"]]
    assert_books_balanced(forked)


def cached_plan(url: str) -> dict[str, Any]:
    fetch = factories.step(
        "fetch",
        "http",
        params={"url": f"{url}/price?q=${{variables.q}}"},
        cache={"key": "price:${variables.q}", "ttl": "1h"},
    )
    return {
        "name": "cached",
        "variables": {"q": "chips"},
        "agents": [{"name": "a", "tasks": [{"name": "t", "steps": [fetch]}]}],
    }


def test_a_cache_hit_does_not_call_the_tool_and_is_charged_nothing(
    celery_worker: str, http_server: HttpServer
) -> None:
    http_server.respond("/price", json={"price": 7})
    organization = factories.org(credits=100)
    first = submit(cached_plan(http_server.url), organization=organization)
    assert wait_for(first).status == "completed"
    assert calls(http_server, "/price") == 1

    second = submit(cached_plan(http_server.url), organization=organization)
    assert wait_for(second).status == "completed"

    assert calls(http_server, "/price") == 1  # answered from the cache
    hit, source = steps_of(second)["fetch"], steps_of(first)["fetch"]
    assert hit.cached_from == {"run": str(first.pk), "step": source.pk}
    assert hit.output == source.output
    assert hit.cost == 0
    assert not LedgerEntry.objects.filter(run=second, type="charge").exists()
    assert run_history(second).filter(kind="reuse", entity_id=str(hit.pk)).exists()

    # Never across organizations: another one's identical step calls the tool.
    other = submit(cached_plan(http_server.url), organization=factories.org(credits=100))
    assert wait_for(other).status == "completed"
    assert calls(http_server, "/price") == 2
    assert steps_of(other)["fetch"].cached_from is None

    answer = client_of(organization).post(
        "/api/v1/cache/invalidate", {"key": "price:chips"}, format="json"
    )
    assert (answer.status_code, answer.json()) == (200, {"invalidated": 1})
    third = submit(cached_plan(http_server.url), organization=organization)
    assert wait_for(third).status == "completed"
    assert calls(http_server, "/price") == 3
    for run in (first, second, other, third):
        assert_books_balanced(run)


def test_a_retry_with_reuse_does_not_ask_again_for_an_approval_given(
    celery_worker: str, http_server: HttpServer
) -> None:
    http_server.respond("/after", status=404, times=1)
    http_server.respond("/after", json={"n": 1})
    signed = {
        "name": "signed",
        "agents": [
            {
                "name": "a",
                "tasks": [
                    {
                        "name": "t",
                        "steps": [
                            factories.step("sign", "approval"),
                            factories.step(
                                "after", "http", params={"url": f"{http_server.url}/after"},
                                retry=ONCE,
                            ),
                        ],
                    }
                ],
            }
        ],
    }  # fmt: skip
    run = submit(signed)
    wait_for(run, ("waiting_approval",))
    approvals.run_approve(run_id=run.pk, comment="fine")
    assert wait_for(run).status == "failed"
    first = steps_of(run)

    services.run_retry(run_id=run.pk, reuse="completed")
    done = wait_for(run)

    assert done.status == "completed", done.last_error
    second = steps_of(run)
    assert second["sign"].reused_from == {"attempt": 1, "step": first["sign"].pk}
    assert second["sign"].output == first["sign"].output
    assert not run_history(run).filter(attempt_number=2, to_status="waiting_approval").exists()
    assert_books_balanced(run)
