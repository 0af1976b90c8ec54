"""The operators' live run page: the graph, the time line, progress and credits, the paged
event log, the live endpoint it polls, and its control actions with their confirmation."""

from __future__ import annotations

import json
import re
import time
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from orchestrator.tools.packages import remote
from runs import catalogue, services
from runs.admin.run_page import layout, svg
from runs.engine.outcomes import Outcome, record
from runs.engine.start import run_start
from runs.materialize import add_handler_rows
from runs.models import NO_WORKER_OFFERS_TOOL, Run, RunEvent, RunnerJob, Step
from runs.selectors import run_history
from runs.transitions import claim_step, transition
from tests import factories
from tests.api import states
from tests.factories import step

pytestmark = pytest.mark.django_db


def started(spec: dict[str, Any]) -> Run:
    """A run of ``spec`` started and picked up (its rows materialised), no worker."""
    run = services.run_create(organization=factories.org(credits=100_000), plan=spec)
    run_start(run_id=run.pk)
    services.run_pick_up(run_id=run.pk)
    return Run.objects.get(pk=run.pk)


def dag_plan() -> dict[str, Any]:
    return {
        "name": "dag",
        "agents": [
            {
                "name": "fetch",
                "tasks": [
                    {
                        "name": "pages",
                        "mode": "dag",
                        "steps": [
                            step("a"),
                            step("b", depends_on=["a"]),
                            step("c", depends_on=["a"]),
                            step("d", depends_on=["b", "c"]),
                        ],
                    }
                ],
            },
            {
                "name": "report",
                "depends_on": ["fetch"],
                "tasks": [{"name": "write", "steps": [step("x"), step("y")]}],
            },
        ],
        "mode": "dag",
    }


def page_of(client: Client, run: Run, **params: str) -> str:
    response = client.get(f"/admin/runs/run/{run.pk}/change/", params)
    assert response.status_code == 200, response.content[:500]
    return response.content.decode()


def test_the_graph_draws_every_node_by_status_and_every_dag_edge(operator: Client) -> None:
    run = started(dag_plan())
    steps = {s.name: s for s in Step.objects.filter(run=run)}

    page = page_of(operator, run)

    for name, row in steps.items():
        assert f'id="n-s{row.pk}" class="node step st-{row.status}"' in page, name
    for agent in run.agents.all():
        assert f'id="n-a{agent.pk}" class="node agent st-{agent.status}"' in page
    for task in run.tasks.all():
        assert f'id="n-t{task.pk}" class="node task st-{task.status}"' in page
    # a->b, a->c, b->d, c->d inside the DAG task; x->y (sequential); fetch->report.
    assert page.count('<line class="edge"') == 6
    assert "0 / 6 steps (0.0 %)" in page
    assert 'id="credits-reserved"' in page
    assert 'data-live="1"' in page
    assert '<a href="/admin/dashboard/">Dashboard</a>' in page


def test_node_positions_follow_the_dag_depth(operator: Client) -> None:
    run = started(dag_plan())
    graph = layout.run_graph(run)
    fetch = graph.agents[0]
    nodes = {node.name: node for node in fetch.children[0].children}

    assert nodes["a"].x < nodes["b"].x == nodes["c"].x < nodes["d"].x
    assert nodes["b"].y != nodes["c"].y
    assert graph.agents[0].x < graph.agents[1].x  # report depends on fetch


def test_handlers_and_retries_are_visible(operator: Client) -> None:
    spec = factories.plan()
    spec["agents"][0]["tasks"][0]["steps"] = [
        step("risky", "fail", on_error=[step("tidy")]),
        step("after"),
    ]
    run = started(spec)
    risky = Step.objects.get(run=run, name="risky")
    Step.objects.filter(pk=risky.pk).update(attempts=3)
    add_handler_rows(run, risky.task, risky, "on_error", first_position=10)  # as on failure

    page = page_of(operator, run)

    assert 'class="node step st-pending handler"' in page  # risky.on_error.tidy
    assert page.count('<line class="edge handler"') == 1
    assert "\u21bb2" in page  # three attempts: two retries


def dag_of(steps: int) -> dict[str, Any]:
    """One task of ``steps`` steps, each after the two before it (4,000 edges at 2,000)."""
    spec = factories.plan()
    task = spec["agents"][0]["tasks"][0]
    task["mode"] = "dag"
    task["steps"] = [
        step(f"s{i}", depends_on=[f"s{j}" for j in (i - 1, i - 2) if j >= 0]) for i in range(steps)
    ]
    return spec


@pytest.mark.parametrize(
    "shape",
    [
        pytest.param(
            lambda: factories.plan(agents=4, tasks=10, steps=50), id="40-sequential-tasks"
        ),
        pytest.param(lambda: dag_of(2000), id="one-dag-task"),
    ],
)
def test_a_2000_step_run_draws_compact_cells_and_costs_the_queries_of_a_small_one(
    operator: Client, shape: Any
) -> None:
    small = started(factories.plan(agents=2, tasks=2, steps=5))
    big = started(shape())
    for run in (small, big):
        page_of(operator, run)  # warm the session and content-type caches

    counts = []
    for run in (small, big):
        with CaptureQueriesContext(connection) as captured:
            page = page_of(operator, run)
        counts.append(len(captured))
    started_at = time.perf_counter()
    page = page_of(operator, big)
    took = time.perf_counter() - started_at

    assert counts[0] == counts[1]
    assert page.count('class="node step st-pending cell"') == 2000
    assert len(page) < 1_500_000  # the plan field is cut at PLAN_SHOWN_BYTES
    # Measured, not asserted (docs/operations.md quotes it): the page's server time.
    print(f"2,000-step run page ({len(page) // 1024} KiB): {took * 1000:.0f} ms")


def test_the_timeline_shows_queue_wait_backoff_and_attempts() -> None:
    run = started(factories.plan(steps=1))
    flaky = Step.objects.get(run=run)
    t0 = timezone.now()
    Step.objects.filter(pk=flaky.pk).update(dispatched_at=t0)

    def at(seconds: float) -> Any:
        return t0 + timedelta(seconds=seconds)

    def event(source: str, target: str, seconds: float, **payload: Any) -> None:
        # Inserted with their time (events are append-only: no UPDATE, even in a test).
        with connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO runs_runevent (run_id, attempt_number, entity, entity_id, kind,"
                " from_status, to_status, actor, message, payload, created_at)"
                " VALUES (%s, 1, 'step', %s, 'transition', %s, %s, 'w', '', %s, %s)",
                [run.pk, str(flaky.pk), source, target, json.dumps(payload), at(seconds)],
            )

    event("pending", "running", 1.0, attempt=1)
    event("running", "pending", 2.0, attempt=1, delay_ms=500)
    event("pending", "running", 3.0, attempt=2)
    event("running", "completed", 4.5, attempt=2)

    gantt = layout.run_gantt(run, now=at(10))

    [row] = gantt.rows
    assert row.label == "agent-0.task-0.step-0"
    shape = [(s.kind, s.start, s.end, s.outcome) for s in row.segments]
    assert shape == [
        ("queue", 0.0, 1.0, ""),
        ("run", 1.0, 2.0, "pending"),
        ("backoff", 2.0, 2.5, ""),
        ("queue", 2.5, 3.0, ""),
        ("run", 3.0, 4.5, "completed"),
    ]
    assert gantt.span == 4.5


def test_the_time_a_step_waited_parked_is_its_own_bar_before_the_attempt_that_ran() -> None:
    run = started(factories.plan(steps=1))
    held = Step.objects.get(run=run)
    t0 = timezone.now()
    Step.objects.filter(pk=held.pk).update(dispatched_at=t0)

    def event(source: str, target: str, seconds: float, **payload: Any) -> None:
        with connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO runs_runevent (run_id, attempt_number, entity, entity_id, kind,"
                " from_status, to_status, actor, message, payload, created_at)"
                " VALUES (%s, 1, 'step', %s, 'transition', %s, %s, 'w', '', %s, %s)",
                [run.pk, str(held.pk), source, target, json.dumps(payload),
                 t0 + timedelta(seconds=seconds)],
            )  # fmt: skip

    # Claimed at 1 s and parked at once (a rate limit's line, a timer: its event names
    # `until`), claimed again at 4 s, when its tool ran for half a second.
    event("pending", "running", 1.0, attempt=1)
    event("running", "pending", 1.0, attempt=1, rate_limit="openai", until="...")
    event("pending", "running", 4.0, attempt=1)
    event("running", "completed", 4.5, attempt=1)

    [row] = layout.run_gantt(run, now=t0 + timedelta(seconds=10)).rows

    shape = [(s.kind, s.start, s.end) for s in row.segments]
    assert shape == [("queue", 0.0, 1.0), ("wait", 1.0, 4.0), ("run", 4.0, 4.5)]
    Step.objects.filter(pk=held.pk).update(waited_ms=3000)
    assert "attempt(s), waited 3 s</title>" in svg.graph_svg(layout.run_graph(run))
    assert 'class="seg wait"' in svg.gantt_svg(
        layout.run_gantt(run, now=t0 + timedelta(seconds=10))
    )


def test_the_plan_is_shown_whole_when_small_and_cut_when_big(operator: Client) -> None:
    small = started(factories.plan())
    big = started(factories.plan(agents=4, tasks=10, steps=50))

    assert "the whole plan is the run" not in page_of(operator, small)
    assert "&quot;name&quot;: &quot;step-1&quot;" in page_of(operator, small)
    assert f"the whole plan is the run's <code>plan</code> in <code>GET /api/v1/runs/{big.pk}" in (
        page_of(operator, big)
    )


def test_a_wait_for_approval_is_its_own_segment() -> None:
    spec = factories.plan()
    spec["agents"][0]["tasks"][0]["steps"] = [step("gate", "approval")]
    run = started(spec)
    gate = Step.objects.get(run=run)
    transition(Step, gate.pk, "waiting_approval")
    waiting = layout.run_gantt(run).rows[0].segments[-1]
    transition(Step, gate.pk, "completed")

    decided = layout.run_gantt(run).rows[0].segments[-1]

    assert (waiting.kind, waiting.outcome) == ("decision", "waiting_approval")
    assert (decided.kind, decided.outcome) == ("decision", "completed")


def test_the_page_offers_the_controls_the_state_machine_allows(operator: Client) -> None:
    run = started(factories.plan())
    running = page_of(operator, run)
    services.run_cancel(run_id=run.pk, reason="test", actor="test")
    ended = page_of(operator, run)

    assert 'id="control-cancel"' in running
    assert 'id="control-pause"' in running
    assert 'id="control-retry"' not in running
    assert 'id="control-approve"' not in running  # nothing waits
    assert 'id="control-cancel"' not in ended
    assert 'data-live="0"' in ended


def test_a_running_attempt_runs_until_now() -> None:
    run = started(factories.plan(steps=1))
    the_step = Step.objects.get(run=run)
    transition(Step, the_step.pk, "running", payload={"attempt": 1})

    gantt = layout.run_gantt(run, now=timezone.now() + timedelta(seconds=3))

    [row] = gantt.rows
    assert row.segments[-1].outcome == "running"
    assert row.segments[-1].end >= 3.0


def test_the_live_endpoint_gives_each_node_and_a_token_that_changes_with_the_shape(
    operator: Client,
) -> None:
    run = started(dag_plan())
    page = page_of(operator, run)
    token = re.search(r'data-reload-token="(\w+)"', page)[1]
    first = Step.objects.get(run=run, name="a")

    live = operator.get(f"/admin/runs/run/{run.pk}/live/").json()
    assert live["nodes"][f"n-s{first.pk}"] == ["pending", 0]
    assert live["reload_token"] == token
    assert live["live"] is True
    assert live["progress"] == {"percent": 0.0, "steps_finished": 0, "steps_total": 6}

    transition(Step, first.pk, "running")
    assert operator.get(f"/admin/runs/run/{run.pk}/live/").json()["nodes"][f"n-s{first.pk}"] == [
        "running",
        0,
    ]
    services.run_pause(run_id=run.pk, actor="test")
    assert operator.get(f"/admin/runs/run/{run.pk}/live/").json()["reload_token"] != token


def test_the_event_log_is_paged_newest_first(operator: Client) -> None:
    run = started(factories.plan())
    for number in range(120):  # operators' notes, say: any events will do
        RunEvent.objects.create(run=run, entity="run", entity_id=str(run.pk), kind="operator",
                                message=f"note {number}")  # fmt: skip
    total = run_history(run).count()
    assert total > layout.EVENTS_PER_PAGE

    first = page_of(operator, run)
    older = re.search(r'id="events-older" href="\?events_before=(\d+)"', first)
    assert older is not None
    second = page_of(operator, run, events_before=older[1])

    def rows(text: str) -> int:
        return text.split('id="run-events"')[1].split("</table>")[0].count("<tr>") - 1

    assert rows(first) == layout.EVENTS_PER_PAGE
    assert rows(second) == min(layout.EVENTS_PER_PAGE, total - layout.EVENTS_PER_PAGE)
    # Newest first: the run's creation (its first event) is on the last page only.
    assert "created -&gt; pending" not in first
    pages, before = [first], older[1]
    while before:
        pages.append(page_of(operator, run, events_before=before))
        found = re.search(r'id="events-older" href="\?events_before=(\d+)"', pages[-1])
        before = found[1] if found else ""
    assert "created -&gt; pending" in pages[-1]
    assert sum(rows(page) for page in pages) == total


def test_a_control_asks_for_confirmation_then_goes_through_the_service(operator: Client) -> None:
    run = started(factories.plan())
    url = f"/admin/runs/run/{run.pk}/control/cancel/"

    confirm = operator.get(url)
    assert confirm.status_code == 200
    assert "Cancel this run?" in confirm.content.decode()
    assert Run.objects.get(pk=run.pk).status == "running"  # asking changes nothing

    done = operator.post(url, {"comment": "wrong input file"}, follow=True)

    assert "Cancel: done (run, as admin:ops)" in done.content.decode()
    cancelled = Run.objects.get(pk=run.pk)
    assert (cancelled.status, cancelled.cancel_reason) == ("cancelled", "wrong input file")
    assert run_history(run).filter(to_status="cancelled", actor="admin:ops").exists()


def test_a_refused_control_says_why_and_changes_nothing(operator: Client) -> None:
    run = started(factories.plan())

    done = operator.post(f"/admin/runs/run/{run.pk}/control/retry/", follow=True)

    assert "Retry: refused:" in done.content.decode()
    assert Run.objects.get(pk=run.pk).status == "running"


def test_approving_one_step_from_the_page(operator: Client) -> None:
    spec = factories.plan()
    spec["agents"][0]["tasks"][0]["steps"] = [step("gate", "approval"), step("after")]
    run = started(spec)
    gate = Step.objects.get(run=run, name="gate")
    transition(Step, gate.pk, "waiting_approval")
    Run.objects.filter(pk=run.pk).update(status="waiting_approval", waiting_approvals=1)

    page = page_of(operator, run)
    assert f'id="approve-{gate.pk}"' in page
    assert "agent-0.task-0.gate" in page
    confirm = operator.get(f"/admin/runs/run/{run.pk}/control/approve/", {"step_id": gate.pk})
    assert "Approve step agent-0.task-0.gate of this run?" in confirm.content.decode()

    operator.post(
        f"/admin/runs/run/{run.pk}/control/approve/", {"step_id": gate.pk, "comment": "ok"}
    )

    gate.refresh_from_db()
    assert gate.status == "completed"
    assert gate.output == {"approved": True, "comment": "ok", "by": "admin:ops"}
    assert Run.objects.get(pk=run.pk).status == "running"


def test_unknown_actions_and_runs_are_404_and_staff_only(operator: Client, client: Client) -> None:
    run = started(factories.plan())

    assert operator.get(f"/admin/runs/run/{run.pk}/control/explode/").status_code == 404
    assert (
        operator.get("/admin/runs/run/00000000-0000-0000-0000-000000000000/live/").status_code
        == 404
    )
    operator.logout()
    anonymous = client.get(f"/admin/runs/run/{run.pk}/live/")
    assert anonymous.status_code == 302
    assert "/admin/login/" in anonymous["Location"]
    before = Run.objects.get(pk=run.pk).status
    client.post(f"/admin/runs/run/{run.pk}/control/cancel/")
    assert Run.objects.get(pk=run.pk).status == before


def test_the_page_links_each_steps_runner_job_and_child_run(operator: Client) -> None:
    organization = factories.org()
    job = states.runner_job(organization)
    step, child = states.child_step(organization)

    with_job = page_of(operator, Run.objects.get(pk=job.run_id))
    with_child = page_of(operator, Run.objects.get(pk=step.run_id))

    assert reverse("admin:runs_runnerjob_change", args=[job.pk]) in with_job
    assert reverse("admin:runs_run_change", args=[child.pk]) in with_child
    assert "Work elsewhere" not in page_of(operator, started(factories.plan()))


def test_the_page_links_a_worker_tools_job_and_says_it_waits_for_a_worker() -> None:
    organization = factories.org()
    definition = {
        "name": "acme.summarize",
        "version": "1",
        "description": "",
        "params_schema": {"type": "object", "properties": {"text": {"type": "string"}}},
        "output_schema": {},
        "cost": {},
    }
    catalogue.publish(
        organization=organization, definitions=[catalogue.definition_from(definition)], by="gone"
    )
    spec = factories.plan(name="worker-tool", steps=1)
    spec["agents"][0]["tasks"][0]["steps"] = [
        {"name": "s", "tool": "acme.summarize", "params": {"text": "x"}}
    ]
    run = states.running_plan(organization, spec)
    step = Step.objects.get(run=run, name="s")
    claimed = claim_step(step.pk, worker="test", task_id="test", lease_seconds=60)
    assert claimed is not None
    wait = remote("acme.summarize").run({"text": "x"}, None)  # type: ignore[arg-type,misc]
    record(step.pk, run.pk, claimed["attempts"], Outcome(wait=wait.wait))
    job = RunnerJob.objects.get(step=step)

    (work,) = layout.work_elsewhere(run)

    assert (work.tool, work.job, work.waiting_reason) == (
        "acme.summarize",
        job.pk,
        NO_WORKER_OFFERS_TOOL,
    )
