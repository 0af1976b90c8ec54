"""The runs admin: pages cost a bounded number of queries, actions call the services."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from runs import services
from runs.engine.start import run_start
from runs.models import Run
from tests import factories
from tests.api import states

pytestmark = pytest.mark.django_db


def make_runs(count: int) -> Run:
    organization = factories.org()
    template = factories.run(organization, agents=2, tasks=2, steps=3)
    Run.objects.bulk_create(
        Run(organization=organization, name=f"bulk-{i}", plan=template.plan, status="created")
        for i in range(count - 1)
    )
    run_start(run_id=template.pk)
    services.run_pick_up(run_id=template.pk)
    return template


def queries(client: Client, url: str) -> int:
    client.get(url)  # warm: session and content-type caches would count once otherwise
    with CaptureQueriesContext(connection) as captured:
        response = client.get(url)
    assert response.status_code == 200, response.content[:500]
    return len(captured)


def test_run_list_and_detail_cost_the_same_queries_for_10_and_1000_runs(operator: Client) -> None:
    small = make_runs(10)
    list_small = queries(operator, "/admin/runs/run/")
    detail_small = queries(operator, f"/admin/runs/run/{small.pk}/change/")

    big = make_runs(990)  # 1,000 runs in all
    list_big = queries(operator, "/admin/runs/run/")
    detail_big = queries(operator, f"/admin/runs/run/{big.pk}/change/")

    assert list_small == list_big
    assert detail_small == detail_big


def test_run_detail_shows_hierarchy_and_events_in_order(operator: Client) -> None:
    run = make_runs(1)

    page = operator.get(f"/admin/runs/run/{run.pk}/change/").content.decode()

    assert "agent agent-0" in page
    assert "task task-1" in page
    assert "3 pending" in page
    # The event log is newest first (paged: tests/runs/test_run_page.py).
    assert page.index("pending -&gt; running") < page.index("created -&gt; pending")


def test_search_by_id_and_filter_by_status(operator: Client) -> None:
    run = make_runs(3)

    by_id = operator.get("/admin/runs/run/", {"q": str(run.pk)}).content.decode()
    by_status = operator.get("/admin/runs/run/", {"status__exact": "running"}).content.decode()

    assert run.name in by_id
    assert "bulk-0" not in by_id
    assert run.name in by_status
    assert "bulk-0" not in by_status


def test_cancel_action_goes_through_the_service(operator: Client) -> None:
    run = make_runs(1)

    operator.post("/admin/runs/run/", {"action": "cancel_runs", "_selected_action": [str(run.pk)]})

    cancelled = Run.objects.get(pk=run.pk)
    assert cancelled.status == "cancelled"
    assert cancelled.cancel_reason == "cancelled by admin:ops"


def test_api_key_created_in_admin_is_shown_once_and_stored_hashed(operator: Client) -> None:
    organization = factories.org()

    response = operator.post(
        "/admin/billing/apikey/add/",
        {"organization": str(organization.pk), "name": "ci"},
        follow=True,
    )

    text = response.content.decode()
    assert "it will not be shown again: ork_" in text
    raw = text.split("it will not be shown again: ")[1].split("<")[0].strip()
    key = organization.api_keys.get()
    assert raw not in key.key_hash
    assert raw.split("_")[1] == key.prefix


def test_runners_and_their_jobs_are_listed_and_a_job_is_stopped_through_the_service(
    operator: Client,
) -> None:
    organization = factories.org()
    holder = states.runner(organization)
    job = states.runner_job(organization, holder)

    assert holder.pk in operator.get("/admin/runs/runner/").content.decode()
    assert str(job.pk) in operator.get("/admin/runs/runnerjob/").content.decode()
    operator.post(
        "/admin/runs/runnerjob/", {"action": "stop_jobs", "_selected_action": [str(job.pk)]}
    )

    job.refresh_from_db()
    assert job.status == "stopping"
