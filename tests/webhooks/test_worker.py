"""Run webhooks with real worker processes, as the Procfile starts them: the `worker`
runs steps, the `webhooks` process (a pool of threads, the webhooks queue alone) sends.
A run ended on the worker is delivered; a receiver that drips its headers is cut at
WEBHOOK_TIMEOUT and recorded while a run of the same organization goes through; one
organization's slow backlog does not hold up another organization's delivery, and its
tarpits hold no more of the sending threads than its quota; a worker killed while
sending loses nothing (the claim's lease ends and the delivery is sent
again)."""

from __future__ import annotations

import signal
import time
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings

from billing import quotas
from config.celery import app
from orchestrator import webhooks as sender
from orchestrator.tasks import sweep_webhooks_task, webhook_delivery_task
from runs.models import Run, Step
from tests import factories
from tests.http_fixture import DrippingReceiver, HttpServer
from tests.integration.engine_support import wait_for
from tests.support import Child, child_env, python_cmd, wait_until
from tests.tenants import make_tenant
from tests.webhooks.support import SECRET, delivery_ids, endpoint, verify
from webhooks import services
from webhooks.models import WebhookAttempt, WebhookDelivery

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def delivered(*deliveries: WebhookDelivery) -> bool:
    """Beat's part, played by the test: ask for a sweep, then look."""
    sweep_webhooks_task.delay()
    statuses = WebhookDelivery.objects.filter(pk__in=[d.pk for d in deliveries])
    return all(status == "delivered" for status in statuses.values_list("status", flat=True))


def test_a_run_completed_on_the_worker_is_delivered_signed(
    celery_worker: str, webhooks_worker: str, http_server: HttpServer
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


def test_a_dripping_receiver_is_cut_and_recorded_while_its_organizations_run_goes_on(
    celery_worker: str, webhooks_worker: str
) -> None:
    tenant = make_tenant()
    with DrippingReceiver() as receiver:
        hooks = [endpoint(tenant.organization, f"{receiver.url}/hook-{n}") for n in range(3)]
        pings = [services.endpoint_test(endpoint_id=hook.pk) for hook in hooks]
        sweep_webhooks_task.delay()
        wait_until(lambda: receiver.answered >= 3, timeout=20, what="three sends held")

        response = tenant.post("/api/v1/runs", {"plan": factories.plan(steps=4), "start": True})
        assert response.status_code == 201, response.json()
        run = wait_for(Run.objects.get(pk=response.json()["id"]))

        assert run.status == "completed"
        # Its steps ran on the worker, which the sends never hold.
        workers = set(Step.objects.filter(run=run).values_list("worker", flat=True))
        assert all(celery_worker in worker for worker in workers if worker), workers
        wait_until(
            lambda: all(WebhookAttempt.objects.filter(delivery=p).exists() for p in pings),
            timeout=20,
            what="each held send's attempt",
        )
    for ping in pings:
        first = WebhookAttempt.objects.get(delivery=ping, number=1)
        assert (first.status_code, first.ok) == (None, False)
        assert first.error.startswith("timeout: ")
        assert first.duration_ms < settings.WEBHOOK_LEASE * 1000  # cut before its lease ends


def test_another_organizations_delivery_goes_in_the_next_sweep_past_a_slow_backlog(
    webhooks_worker: str, http_server: HttpServer
) -> None:
    # The shape: one organization's 5 endpoints at a receiver that answers late
    # (8 s of a 10 s WEBHOOK_TIMEOUT there; here the same share of the tests' 1 s), each
    # with 10 pending deliveries: 50 that take 8 rounds of late answers to drain.
    http_server.respond("/slow", status=200, delay=settings.WEBHOOK_TIMEOUT * 0.8)
    http_server.respond("/fast", status=200)
    busy = factories.org()
    slow = [endpoint(busy, f"{http_server.url}/slow?endpoint={n}") for n in range(5)]
    for hook in slow:
        for _ in range(10):
            services.endpoint_test(endpoint_id=hook.pk)

    def five_in_flight() -> bool:
        sweep_webhooks_task.delay()  # beat's part
        return len(http_server.requests) >= 5

    wait_until(five_in_flight, timeout=30, what="the slow five in flight")
    fast_one = services.endpoint_test(
        endpoint_id=endpoint(factories.org(), f"{http_server.url}/fast").pk
    )

    # Claimed by the next sweep (the claim's turns: tests/webhooks/test_fairness.py) and
    # sent by a free thread, whatever is due or held at the slow endpoints.
    wait_until(lambda: delivered(fast_one), timeout=20, what="the other organization's delivery")
    # Sent while the slow backlog (50 answers, 5 at a time, each 0.8 s) was far from done.
    pending = WebhookDelivery.objects.filter(endpoint__in=slow, status="pending").count()
    assert pending >= 20, pending


def most_at_once(attempts: list[WebhookAttempt]) -> int:
    """The most attempts that were under way at one moment. Each ran from its start
    (recorded less its duration) to its record: the next claim of a place can come only
    after that record commits, so these intervals are what the claim bounds."""
    moments = sorted(
        [(a.created_at - timedelta(milliseconds=a.duration_ms), 1) for a in attempts]
        + [(a.created_at, -1) for a in attempts],
        key=lambda moment: (moment[0], moment[1]),  # an end before a start at one time
    )
    most = under_way = 0
    for _, change in moments:
        under_way += change
        most = max(most, under_way)
    return most


def test_one_organizations_tarpits_hold_at_most_its_quota_of_the_sending_threads(
    webhooks_worker: str, http_server: HttpServer
) -> None:
    """8 endpoints of one organization at a receiver that never answers (each attempt
    cut at WEBHOOK_TIMEOUT), against a webhooks process of 10 threads: never more than
    its quota `webhooks_in_flight` (3 here) sent at once, and another organization's
    delivery sent meanwhile."""
    http_server.respond("/fast", status=200)
    busy = factories.org()
    quotas.quotas_set(busy.pk, actor="test", webhooks_in_flight=3)
    with DrippingReceiver() as tarpit:
        for n in range(8):
            services.endpoint_test(endpoint_id=endpoint(busy, f"{tarpit.url}/tar-{n}").pk)
        attempts = WebhookAttempt.objects.filter(delivery__endpoint__organization=busy)

        def rounds_made() -> bool:
            sweep_webhooks_task.delay()  # beat's part
            return attempts.count() >= 9

        wait_until(rounds_made, timeout=60, what="three rounds of the tarpits' attempts")
        fast_one = services.endpoint_test(
            endpoint_id=endpoint(factories.org(), f"{http_server.url}/fast").pk
        )
        wait_until(lambda: delivered(fast_one), timeout=20, what="the other organization's")

    assert most_at_once(list(attempts)) == 3


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


def test_no_task_of_the_webhooks_process_is_acknowledged_late() -> None:
    # Its pool of threads cannot cancel a task: a late-acknowledged one in flight when the
    # broker connection drops is cancelled (CELERY_WORKER_CANCEL_LONG_RUNNING_TASKS_ON_
    # CONNECTION_LOSS) and stops the whole process. Its deliveries' leases recover them.
    routed = [name for name in app.tasks if name.startswith("orchestrator.webhooks.")]
    assert sorted(routed) == ["orchestrator.webhooks.deliver", "orchestrator.webhooks.sweep"]
    assert [app.tasks[name].acks_late for name in sorted(routed)] == [False, False]
    assert app.conf.task_acks_late  # the rest of the tasks are
