"""Run webhooks with real worker processes: a run ended on the worker is delivered; one
slow endpoint does not hold up another organization's deliveries; a worker killed while
sending loses nothing (the claim's lease ends and the delivery is sent again)."""

from __future__ import annotations

import signal
import time
import uuid
from pathlib import Path

import pytest
from django.conf import settings

from orchestrator import webhooks as sender
from orchestrator.tasks import sweep_webhooks_task, webhook_delivery_task
from runs.models import Run
from tests import factories
from tests.api.conftest import make_tenant
from tests.http_fixture import HttpServer
from tests.integration.engine_support import wait_for
from tests.support import Child, child_env, python_cmd, wait_until
from tests.webhooks.support import SECRET, delivery_ids, endpoint, verify
from webhooks import services
from webhooks.models import WebhookDelivery

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def delivered(*deliveries: WebhookDelivery) -> bool:
    """Beat's part, played by the test: ask for a sweep, then look."""
    sweep_webhooks_task.delay()
    statuses = WebhookDelivery.objects.filter(pk__in=[d.pk for d in deliveries])
    return all(status == "delivered" for status in statuses.values_list("status", flat=True))


def test_a_run_completed_on_the_worker_is_delivered_signed(
    celery_worker: str, http_server: HttpServer
) -> None:
    http_server.respond("/hook", status=200)
    tenant = make_tenant()
    hook = endpoint(tenant.organization, f"{http_server.url}/hook", events=["run.completed"])
    response = tenant.post("/api/v1/runs", {"plan": factories.plan(steps=2), "start": True})
    assert response.status_code == 201, response.json()
    run = Run.objects.get(pk=response.json()["id"])

    wait_for(run)
    (delivery,) = WebhookDelivery.objects.filter(endpoint=hook)
    wait_until(lambda: delivered(delivery), timeout=20, what="the run's delivery")

    (request,) = http_server.requests
    assert verify(SECRET, request.headers["x-orchestrator-signature"], request.body, time.time())
    body = request.json()
    assert (body["type"], body["run"]["id"], body["run"]["status"]) == (
        "run.completed",
        str(run.pk),
        "completed",
    )


def test_a_slow_endpoint_does_not_hold_up_another_organizations_delivery(
    celery_worker: str, http_server: HttpServer
) -> None:
    http_server.respond("/slow", status=200, delay=settings.WEBHOOK_TIMEOUT * 0.8)
    http_server.respond("/fast", status=200)
    slow = endpoint(factories.org(), f"{http_server.url}/slow")
    fast = endpoint(factories.org(), f"{http_server.url}/fast")
    slow_ones = [services.endpoint_test(endpoint_id=slow.pk) for _ in range(3)]
    fast_one = services.endpoint_test(endpoint_id=fast.pk)

    wait_until(lambda: delivered(fast_one), timeout=20, what="the fast endpoint's delivery")

    # Sent while the slow endpoint's three (one at a time, each ~0.8 s) were still going.
    done = WebhookDelivery.objects.filter(pk__in=[d.pk for d in slow_ones], status="delivered")
    assert done.count() <= 1
    wait_until(lambda: delivered(*slow_ones), timeout=30, what="the slow endpoint's deliveries")
    paths = [request.path for request in http_server.requests]
    assert paths.index("/fast") <= 1


def test_a_worker_killed_while_sending_loses_nothing(
    http_server: HttpServer, tmp_path: Path, django_db_setup: None
) -> None:
    http_server.respond("/hook", status=200, delay=60, times=1)  # held until the kill
    http_server.respond("/hook", status=200)
    hook = endpoint(factories.org(), f"{http_server.url}/hook")
    delivery = services.endpoint_test(endpoint_id=hook.pk)
    (claim,) = services.deliveries_claim(
        limit=1, per_endpoint=1, lease_seconds=settings.WEBHOOK_LEASE
    )
    # A queue of this test's own, so that no other worker of the session takes it.
    queue = f"webhooks-kill-{uuid.uuid4().hex[:8]}"
    webhook_delivery_task.apply_async(args=(claim.delivery_id, claim.token), queue=queue)
    worker = Child(
        python_cmd(
            "-m", "celery", "-A", "config", "worker", "--queues", queue,
            "--concurrency", "1", "--pool", "prefork",
            "--hostname", f"{queue}@localhost", "--without-mingle", "--without-gossip",
        ),
        child_env(HTTP_TOOL_ALLOWED_NETWORKS="127.0.0.0/8"),
        tmp_path / "worker.log",
    )  # fmt: skip
    try:
        wait_until(lambda: http_server.requests, timeout=60, what="the worker's POST")
    finally:
        worker.stop(signal.SIGKILL, timeout=10)
        worker.kill_group()

    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempts) == ("pending", 0)
    assert delivery.lease_until is not None

    def sent_again() -> bool:
        for again in services.deliveries_claim(
            limit=1, per_endpoint=1, lease_seconds=settings.WEBHOOK_LEASE
        ):
            sender.deliver(again.delivery_id, again.token)
        return WebhookDelivery.objects.get(pk=delivery.pk).status == "delivered"

    wait_until(sent_again, timeout=20, what="the delivery after its lease ended")

    first, second = http_server.requests
    assert delivery_ids([first, second]) == [str(delivery.uid)] * 2
    assert first.body == second.body
    assert [a.number for a in delivery.attempt_records.all()] == [1]
