"""Sending a delivery for real, to a receiver on the loopback, in this process: the sweep's
claim and the task's send are the functions the worker calls (tests/webhooks/test_worker.py
runs them in a worker). What a receiver sees, what each attempt records, what follows."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from django.conf import settings as django_settings

from common import metrics
from orchestrator import webhooks as sender
from runs.models import Run
from runs.selectors import run_history
from runs.services import run_cancel
from tests import factories
from tests.http_fixture import MEMORY_BOUND, DrippingReceiver, HttpServer, gzip_bomb, peak_memory
from tests.support import wait_until
from tests.webhooks.support import SECRET, delivery_ids, endpoint, verify
from webhooks import services
from webhooks.models import WebhookDelivery, WebhookEndpoint

pytestmark = pytest.mark.django_db


def send_due(per_endpoint: int = 1) -> int:
    """What beat's sweep and the delivery task do, here: claim what is due, send each."""
    claims = services.deliveries_claim(
        limit=50, per_endpoint=per_endpoint, lease_seconds=django_settings.WEBHOOK_LEASE
    )
    for claim in claims:
        sender.deliver(claim.delivery_id, claim.token)
    return len(claims)


def ended_run(hook: WebhookEndpoint) -> Run:
    run = factories.run(hook.organization)
    run_cancel(run_id=run.pk, reason="done with it")
    return run


def the_delivery() -> WebhookDelivery:
    return WebhookDelivery.objects.get()


def attempts(delivery: WebhookDelivery) -> list[tuple[int, int | None, bool]]:
    return [(a.number, a.status_code, a.ok) for a in delivery.attempt_records.order_by("number")]


def settled(status: str = "delivered") -> Any:
    def check() -> bool:
        send_due()
        return the_delivery().status == status

    return check


def test_a_delivery_is_signed_and_says_what_happened_to_the_run(http_server: HttpServer) -> None:
    http_server.respond("/hook", status=204)
    hook = endpoint(factories.org(), f"{http_server.url}/hook")
    run = ended_run(hook)

    assert send_due() == 1

    (request,) = http_server.requests
    delivery = the_delivery()
    assert delivery.status == "delivered"
    assert verify(SECRET, request.headers["x-orchestrator-signature"], request.body, time.time())
    assert not verify(
        "another-secret", request.headers["x-orchestrator-signature"], request.body, time.time()
    )
    assert request.headers["x-orchestrator-event"] == "run.cancelled"
    assert request.headers["x-orchestrator-delivery"] == str(delivery.uid)
    assert request.headers["content-type"] == "application/json"
    body = request.json()
    assert (body["id"], body["type"]) == (str(delivery.uid), "run.cancelled")
    assert body["created_at"] == delivery.created_at.isoformat()
    assert body["organization"] == str(hook.organization_id)
    assert {k: body["run"][k] for k in ("id", "name", "status")} == {
        "id": str(run.pk),
        "name": run.name,
        "status": "cancelled",
    }
    assert body["run"]["cancel_reason"] == "done with it"
    assert body["links"]["run"].endswith(f"/api/v1/runs/{run.pk}")
    assert attempts(delivery) == [(1, 204, True)]
    assert WebhookEndpoint.objects.get(pk=hook.pk).last_delivered_at is not None


def test_a_failing_receiver_is_retried_with_the_same_id_and_body(http_server: HttpServer) -> None:
    http_server.respond("/hook", status=500, body="boom", times=2)
    http_server.respond("/hook", status=200)
    hook = endpoint(factories.org(), f"{http_server.url}/hook")
    ended_run(hook)

    wait_until(settled(), timeout=10, what="the third attempt")

    delivery = the_delivery()
    assert attempts(delivery) == [(1, 500, False), (2, 500, False), (3, 200, True)]
    first, second, third = http_server.requests
    assert len(set(delivery_ids([first, second, third]))) == 1
    assert first.body == second.body == third.body
    assert json.loads(third.body)["id"] == str(delivery.uid)
    assert delivery.attempt_records.get(number=1).error == "HTTP 500: boom"
    assert WebhookEndpoint.objects.get(pk=hook.pk).consecutive_failures == 0


def test_a_receiver_that_does_not_answer_in_time_is_retried(http_server: HttpServer) -> None:
    http_server.respond("/hook", delay=django_settings.WEBHOOK_TIMEOUT + 0.5, times=1)
    http_server.respond("/hook", status=200)
    hook = endpoint(factories.org(), f"{http_server.url}/hook")
    ended_run(hook)

    send_due()
    timed_out = the_delivery().attempt_records.get()
    assert (timed_out.status_code, timed_out.ok) == (None, False)
    assert timed_out.error.startswith("timeout: ")
    assert timed_out.duration_ms >= django_settings.WEBHOOK_TIMEOUT * 1000 * 0.9
    assert the_delivery().status == "pending"

    wait_until(settled(), timeout=10, what="the retry")
    assert attempts(the_delivery()) == [(1, None, False), (2, 200, True)]


def test_a_receiver_that_drips_its_headers_is_cut_at_the_timeout_and_recorded(
    settings: Any,
) -> None:
    settings.HTTP_TOOL_ALLOWED_NETWORKS = ["127.0.0.0/8"]  # the receiver, on the loopback
    with DrippingReceiver() as receiver:
        hook = endpoint(factories.org(), f"{receiver.url}/hook")
        ended_run(hook)

        send_due()

        assert receiver.answered == 1
    cut = the_delivery().attempt_records.get()
    assert (cut.status_code, cut.ok) == (None, False)
    assert cut.error.startswith("timeout: ")
    # Cut at the bound of the whole exchange, well within the claim's lease: no other
    # sweep claims it meanwhile.
    timeout_ms = django_settings.WEBHOOK_TIMEOUT * 1000
    assert timeout_ms * 0.9 <= cut.duration_ms < django_settings.WEBHOOK_LEASE * 1000
    delivery = the_delivery()
    assert (delivery.status, delivery.attempts, delivery.lease_token) == ("pending", 1, None)


def test_a_slow_answer_within_the_timeout_is_delivered_with_its_latency(
    http_server: HttpServer,
) -> None:
    http_server.respond("/hook", status=200, delay=0.4)
    hook = endpoint(factories.org(), f"{http_server.url}/hook")
    ended_run(hook)

    send_due()

    (attempt,) = the_delivery().attempt_records.all()
    assert (attempt.status_code, attempt.ok) == (200, True)
    assert attempt.duration_ms >= 400


def test_410_gone_fails_the_delivery_and_disables_the_endpoint_at_once(
    http_server: HttpServer,
) -> None:
    http_server.respond("/hook", status=410)
    hook = endpoint(factories.org(), f"{http_server.url}/hook")
    ended_run(hook)

    send_due()

    assert the_delivery().status == "failed"
    hook.refresh_from_db()
    assert (hook.enabled, hook.disabled_reason) == (False, "the endpoint answered 410 Gone")
    # The organization's next run says so in its timeline; nothing more is sent.
    run = ended_run(hook)
    assert "410 Gone" in run_history(run).get(entity="webhook").message
    assert WebhookDelivery.objects.count() == 1


def test_an_endpoint_failing_for_long_is_disabled_and_its_deliveries_wait(
    http_server: HttpServer, settings: Any
) -> None:
    settings.WEBHOOK_DISABLE_FAILURES = 3
    settings.WEBHOOK_DISABLE_AFTER = 0
    http_server.respond("/hook", status=503)
    hook = endpoint(factories.org(), f"{http_server.url}/hook")
    ended_run(hook)

    def disabled() -> bool:
        send_due()
        return not WebhookEndpoint.objects.get(pk=hook.pk).enabled

    wait_until(disabled, timeout=10, what="the endpoint to be disabled")

    hook.refresh_from_db()
    assert hook.consecutive_failures == 3
    assert hook.disabled_reason.startswith("failed 3 attempts in a row")
    assert the_delivery().status == "pending"  # kept, not sent while disabled
    assert send_due() == 0

    http_server.respond("/hook", status=200)
    http_server.reset()
    http_server.respond("/hook", status=200)
    services.endpoint_update(endpoint_id=hook.pk, enabled=True)
    wait_until(settled(), timeout=10, what="the delivery after the endpoint is enabled")


def attempts_counted() -> dict[str, float]:
    """``orchestrator_webhook_attempts_total`` as Redis holds it: outcome -> attempts."""
    raw = metrics.connection().hgetall(metrics.WEBHOOK_ATTEMPTS)
    return {field.decode(): float(count) for field, count in raw.items()}


def test_each_attempt_is_counted_for_prometheus_by_what_it_came_to(
    http_server: HttpServer,
) -> None:
    http_server.respond("/ok", status=204)
    http_server.respond("/down", status=500)
    http_server.respond("/gone", status=410)
    for path in ("ok", "down", "gone"):
        ended_run(endpoint(factories.org(), f"{http_server.url}/{path}"))
    before = attempts_counted()

    assert send_due() == 3

    after = attempts_counted()
    grew = {outcome: after.get(outcome, 0) - before.get(outcome, 0) for outcome in after}
    assert grew == {"delivered": 1, "retry": 1, "failed": 1}
    statuses = sorted(WebhookDelivery.objects.values_list("status", flat=True))
    assert statuses == ["delivered", "failed", "pending"]


def test_past_its_retry_window_a_delivery_fails_and_can_be_sent_again_by_hand(
    http_server: HttpServer, settings: Any
) -> None:
    settings.WEBHOOK_RETRY_WINDOW = 0
    http_server.respond("/hook", status=500, times=1)
    http_server.respond("/hook", status=200)
    hook = endpoint(factories.org(), f"{http_server.url}/hook")
    ended_run(hook)

    send_due()
    assert the_delivery().status == "failed"

    settings.WEBHOOK_RETRY_WINDOW = 3600
    services.delivery_redeliver(delivery_uid=the_delivery().uid)
    send_due()

    assert attempts(the_delivery()) == [(1, 500, False), (2, 200, True)]
    assert len(set(delivery_ids(http_server.requests))) == 1


def test_the_guard_refuses_an_address_not_allowed_at_delivery_time(
    http_server: HttpServer, settings: Any
) -> None:
    settings.HTTP_TOOL_ALLOWED_NETWORKS = []
    http_server.respond("/hook", status=200)
    hook = endpoint(factories.org(), f"{http_server.url}/hook")  # registered: not resolved
    ended_run(hook)

    send_due()

    (attempt,) = the_delivery().attempt_records.all()
    assert (attempt.status_code, attempt.ok) == (None, False)
    assert "HTTP_TOOL_ALLOWED_NETWORKS" in attempt.error
    # The refusal names what was refused: a webhook, not the http tool.
    assert "is a loopback address; a webhook may not be sent to it" in attempt.error
    assert "http tool" not in attempt.error
    assert http_server.requests == []


def test_a_large_answer_is_read_up_to_the_cap(http_server: HttpServer, settings: Any) -> None:
    settings.WEBHOOK_MAX_RESPONSE_BYTES = 100
    http_server.respond("/hook", status=500, chunks=[b"x" * 65536] * 64)
    hook = endpoint(factories.org(), f"{http_server.url}/hook")
    ended_run(hook)

    send_due()

    (attempt,) = the_delivery().attempt_records.all()
    assert attempt.error == "HTTP 500: " + "x" * 100


def test_an_answer_that_inflates_is_read_decoded_up_to_the_cap_and_stored_readable(
    http_server: HttpServer,
) -> None:
    # 256 MiB of zeros in 255 KiB: inflated only as far as the cap, and the NUL
    # characters it decodes to are not what PostgreSQL refuses in the attempt's error.
    http_server.respond("/hook", status=500, body=gzip_bomb(), headers={"Content-Encoding": "gzip"})
    hook = endpoint(factories.org(), f"{http_server.url}/hook")
    ended_run(hook)

    with peak_memory() as peak:
        send_due()

    (attempt,) = the_delivery().attempt_records.all()
    assert attempt.error == "HTTP 500: " + "\ufffd" * 200
    assert peak() < MEMORY_BOUND


def test_a_runs_deliveries_go_in_order_a_later_waits_for_an_earlier(
    http_server: HttpServer,
) -> None:
    http_server.respond("/hook", status=500, times=1)
    http_server.respond("/hook", status=200)
    hook = endpoint(factories.org(), f"{http_server.url}/hook")
    run = factories.run(hook.organization)
    Run.objects.filter(pk=run.pk).update(status="waiting_approval")
    Run.objects.filter(pk=run.pk).update(status="running")
    Run.objects.filter(pk=run.pk).update(status="completed")

    def both_sent() -> bool:
        send_due(per_endpoint=5)
        return not WebhookDelivery.objects.filter(status="pending").exists()

    wait_until(both_sent, timeout=10, what="both deliveries")

    events = [request.headers["x-orchestrator-event"] for request in http_server.requests]
    assert events == ["run.waiting_approval", "run.waiting_approval", "run.completed"]


def test_a_message_received_twice_sends_once() -> None:
    hook = endpoint(factories.org(), "http://127.0.0.1:9/never")
    ended_run(hook)
    (claim,) = services.deliveries_claim(limit=5, per_endpoint=1, lease_seconds=60)
    services.attempt_record(
        delivery_id=claim.delivery_id,
        token=claim.token,
        result=services.AttemptResult(status_code=200, error="", duration_ms=3),
    )

    assert sender.deliver(claim.delivery_id, claim.token) is None  # no longer held
    assert the_delivery().attempts == 1


def test_one_endpoint_has_at_most_its_bound_of_deliveries_in_flight() -> None:
    organization = factories.org()
    busy = endpoint(organization, "http://127.0.0.1:9/busy")
    for _ in range(4):
        services.endpoint_test(endpoint_id=busy.pk)
    other = endpoint(factories.org(), "http://127.0.0.1:9/other")
    services.endpoint_test(endpoint_id=other.pk)

    first = services.deliveries_claim(limit=50, per_endpoint=2, lease_seconds=60)
    again = services.deliveries_claim(limit=50, per_endpoint=2, lease_seconds=60)

    claimed = WebhookDelivery.objects.filter(pk__in=[c.delivery_id for c in first])
    assert sorted(claimed.values_list("endpoint__url", flat=True)) == [
        "http://127.0.0.1:9/busy",
        "http://127.0.0.1:9/busy",
        "http://127.0.0.1:9/other",
    ]
    assert again == []  # two in flight to `busy` already, the other's is out


def test_one_endpoints_backlog_does_not_hide_another_endpoints_delivery() -> None:
    backlog = endpoint(factories.org(), "http://127.0.0.1:9/backlog")
    for _ in range(10):
        services.endpoint_test(endpoint_id=backlog.pk)
    other = endpoint(factories.org(), "http://127.0.0.1:9/other")
    later = services.endpoint_test(endpoint_id=other.pk)  # due after the whole backlog

    claims = services.deliveries_claim(limit=2, per_endpoint=1, lease_seconds=60)

    claimed = WebhookDelivery.objects.filter(pk__in=[c.delivery_id for c in claims])
    assert later.pk in {d.pk for d in claimed}
    assert sorted(d.endpoint_id for d in claimed) == sorted([backlog.pk, other.pk])
