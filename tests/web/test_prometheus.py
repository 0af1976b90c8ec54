"""`GET /metrics` (web/prometheus.py; the counters: common/metrics.py, and
api/metrics.py for the API's requests): only with its bearer token, Prometheus's text
format (parsed with prometheus_client's own parser), the database's figures and the
counters processes keep in Redis. With a real worker: tests/integration/test_metrics.py."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from common import metrics
from config.celery import ALL_QUEUES
from orchestrator import tasks
from runs import services
from runs.engine.start import run_start
from tests import factories
from tests.tenants import Tenant

pytestmark = pytest.mark.django_db

TOKEN = "scrape-me"


def scrape(client: Client) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain; version=")
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: dict[Any, float], name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


@pytest.fixture
def token(settings: Any) -> str:
    settings.METRICS_TOKEN = TOKEN
    return TOKEN


def test_without_a_token_configured_there_is_no_metrics_endpoint(
    client: Client, settings: Any
) -> None:
    settings.METRICS_TOKEN = ""
    assert client.get("/metrics", headers={"Authorization": "Bearer anything"}).status_code == 404


@pytest.mark.usefixtures("token")
@pytest.mark.parametrize("header", [None, "Bearer wrong", f"Basic {TOKEN}", f"Bearer {TOKEN}x"])
def test_it_answers_only_to_its_bearer_token(client: Client, header: str | None) -> None:
    headers = {"Authorization": header} if header else {}
    response = client.get("/metrics", headers=headers)
    assert response.status_code == 401
    assert response["WWW-Authenticate"] == 'Bearer realm="metrics"'
    assert b"orchestrator_" not in response.content


@pytest.mark.usefixtures("token")
def test_runs_ledger_queues_and_api_requests_are_exposed(client: Client, tenant: Tenant) -> None:
    before = scrape(client)
    run = services.run_create(organization=tenant.organization, plan=factories.plan())
    run_start(run_id=run.pk)
    assert tenant.get("/api/v1/runs").status_code == 200
    assert tenant.get("/api/v1/runs/not-a-uuid").status_code == 404

    after = scrape(client)

    assert value(after, "orchestrator_runs", status="pending") >= 1
    assert value(after, "orchestrator_ledger_entries_total", type="reserve") == (
        value(before, "orchestrator_ledger_entries_total", type="reserve") + 1
    )
    assert value(after, "orchestrator_ledger_credits_total", type="grant") > 0
    listed = {"route": "/api/v1/runs", "method": "GET", "status": "200"}
    assert value(after, "orchestrator_api_requests_total", **listed) == (
        value(before, "orchestrator_api_requests_total", **listed) + 1
    )
    unmatched = {"route": "unmatched", "method": "GET", "status": "404"}
    assert value(after, "orchestrator_api_requests_total", **unmatched) >= 1
    for queue in ALL_QUEUES:
        assert ("orchestrator_queue_depth", (("queue", queue),)) in after
    assert value(after, "orchestrator_metrics_redis_up") == 1


@pytest.mark.usefixtures("token")
def test_step_attempts_durations_and_sweeps_are_counted_from_redis(client: Client) -> None:
    before = scrape(client)
    metrics.step_attempt("echo", "completed", 0.02, 0.3)
    metrics.step_attempt("echo", "failed", 7.0, None)
    metrics.flush()  # as the end of a worker's task does
    tasks._swept("leases", {"reclaimed": 2, "failed": 0})

    after = scrape(client)

    def grew(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert grew("orchestrator_step_attempts_total", tool="echo", outcome="completed") == 1
    assert grew("orchestrator_step_attempts_total", tool="echo", outcome="failed") == 1
    assert grew("orchestrator_step_duration_seconds_count", tool="echo") == 2
    assert grew("orchestrator_step_duration_seconds_bucket", tool="echo", le="0.025") == 1
    assert grew("orchestrator_step_duration_seconds_bucket", tool="echo", le="10.0") == 2
    assert grew("orchestrator_step_duration_seconds_bucket", tool="echo", le="+Inf") == 2
    assert grew("orchestrator_step_duration_seconds_sum", tool="echo") == pytest.approx(7.02)
    assert grew("orchestrator_step_queue_wait_seconds_count", tool="echo") == 1
    assert grew("orchestrator_sweep_actions_total", sweep="leases", action="reclaimed") == 2


@pytest.mark.usefixtures("token")
def test_webhook_attempts_and_schedule_fires_are_exposed_by_outcome(client: Client) -> None:
    before = scrape(client)
    for status in ("delivered", "pending", "pending", "failed"):
        metrics.webhook_attempt(status)  # the delivery's status after each attempt
    metrics.schedule_fires("scheduled", "missed", 3)
    metrics.schedule_fires("manual", "fired")

    after = scrape(client)

    def grew(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert grew("orchestrator_webhook_attempts_total", outcome="delivered") == 1
    assert grew("orchestrator_webhook_attempts_total", outcome="retry") == 2
    assert grew("orchestrator_webhook_attempts_total", outcome="failed") == 1
    assert grew("orchestrator_schedule_fires_total", kind="scheduled", outcome="missed") == 3
    assert grew("orchestrator_schedule_fires_total", kind="manual", outcome="fired") == 1
    for queue in ALL_QUEUES:  # read after the counters, from the same pipeline
        assert ("orchestrator_queue_depth", (("queue", queue),)) in after
