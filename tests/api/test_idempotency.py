"""Idempotency-Key: one side effect per key, each rule of api/idempotency.py."""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from cryptography.fernet import Fernet
from django.db import connection
from django.utils import timezone
from rest_framework.test import APIClient

from api.idempotency import (
    IN_PROGRESS_LEASE,
    Claim,
    Scope,
    fingerprint,
    idempotency_claim,
    idempotency_complete,
    idempotency_records_expire,
    seal,
    unseal,
)
from api.models import IdempotencyRecord
from billing.models import LedgerEntry
from billing.services import credits_grant
from common.digests import canonical_json
from runs import services
from runs.engine import control
from runs.engine.start import run_start
from runs.models import HistoryEvent, Run
from tests import factories
from tests.api import states
from tests.api.routes import Route, post_routes
from tests.tenants import Tenant, make_tenant

KEY = "idem_550e8400-e29b-41d4-a716-446655440000"
RUNS = "/api/v1/runs"


def create_body(name: str = "research", start: bool = True) -> dict[str, Any]:
    return {"plan": factories.plan(name=name), "start": start}


def post(tenant: Tenant, path: str, body: Any, key: str = KEY) -> Any:
    return tenant.post(path, body, **{"Idempotency-Key": key})


# --------------------------------------------------------------------------- same key, same body
@pytest.mark.django_db
def test_a_retried_create_replays_the_first_response_with_200_and_no_side_effect(
    tenant: Tenant,
) -> None:
    first = post(tenant, RUNS, create_body())
    events = HistoryEvent.objects.count()
    ledger = LedgerEntry.objects.count()

    again = post(tenant, RUNS, create_body())

    assert first.status_code == 201
    assert "Idempotent-Replayed" not in first.headers
    assert again.status_code == 200
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.json() == first.json()
    assert Run.objects.filter(organization=tenant.organization).count() == 1
    assert (HistoryEvent.objects.count(), LedgerEntry.objects.count()) == (events, ledger)


@pytest.mark.django_db
def test_the_body_is_compared_as_json_not_as_bytes(tenant: Tenant) -> None:
    first = tenant.client.post(
        RUNS,
        '{"start": false, "plan": {"name": "x", "agents": [{"name": "a", "tasks": '
        '[{"name": "t", "steps": [{"name": "s", "tool": "noop"}]}]}]}}',
        content_type="application/json",
        headers={"Idempotency-Key": KEY},
    )
    again = tenant.client.post(
        RUNS, '{"plan":{"agents":[{"tasks":[{"steps":[{"tool":"noop","name":"s"}],"name":"t"}],'
        '"name":"a"}],"name":"x"},"start":false}',
        content_type="application/json", headers={"Idempotency-Key": KEY},
    )  # fmt: skip

    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["id"] == first.json()["id"]


def _prepare(route: Route, tenant: Tenant) -> tuple[str, dict[str, Any]]:
    if route.name == "runs":
        return route.path(), create_body()
    if route.name in states.RUNNER_ROUTES:
        values, body = states.runner_request(route.name, tenant.organization)
        return route.path(**values), body
    if route.name in states.ARTIFACT_ROUTES:
        values, body = states.artifact_request(route.name, tenant.organization)
        return route.path(**values), body
    if route.name in states.ESCALATION_ROUTES:
        values, body = states.escalation_request(route.name, tenant.organization)
        return route.path(**values), body
    if route.name in states.REUSE_ROUTES:
        values, body = states.reuse_request(route.name, tenant.organization)
        return route.path(**values), body
    if route.name in states.SCHEDULE_ROUTES:
        values, body = states.schedule_request(route.name, tenant.organization)
        return route.path(**values), body
    if route.name in states.CALLBACK_ROUTES:
        values, body = states.callback_request(tenant.organization)
        return route.path(**values), body
    if route.name in states.WEBHOOK_ROUTES:
        values, body = states.webhook_request(route.name, tenant.organization)
        return route.path(**{k: v for k, v in values.items() if k in route.parameters}), body
    ready = states.READY_FOR.get(route.name)
    assert ready is not None, f"{route}: add the state it needs to states.READY_FOR"
    return route.path(run_id=ready(tenant.organization).pk), {}


@pytest.mark.django_db
@pytest.mark.parametrize("route", post_routes(), ids=str)
def test_every_post_route_replays_a_success_without_doing_it_again(
    route: Route, tenant: Tenant
) -> None:
    path, body = _prepare(route, tenant)
    first = post(tenant, path, body)
    events = HistoryEvent.objects.count()
    ledger = LedgerEntry.objects.count()

    again = post(tenant, path, body)

    assert 200 <= first.status_code < 300, first.json()
    assert again.status_code == (200 if first.status_code == 201 else first.status_code)
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.json() == first.json()
    assert (HistoryEvent.objects.count(), LedgerEntry.objects.count()) == (events, ledger)


# --------------------------------------------------------------------------- different body
@pytest.mark.django_db
def test_the_same_key_with_a_different_body_is_refused_with_422(tenant: Tenant) -> None:
    post(tenant, RUNS, create_body("first"))

    response = post(tenant, RUNS, create_body("second"))

    assert response.status_code == 422
    assert response.json()["code"] == "idempotency_key_reused"
    assert list(Run.objects.values_list("name", flat=True)) == ["first"]


@pytest.mark.django_db
def test_a_key_is_scoped_to_its_organization_method_and_path(
    tenant: Tenant, other_tenant: Tenant
) -> None:
    run = states.created(tenant.organization)
    first = post(tenant, RUNS, create_body("mine"))
    other = post(other_tenant, RUNS, create_body("theirs"))
    on_another_path = post(tenant, f"{RUNS}/{run.pk}/cancel", {"reason": "changed my mind"})

    assert (first.status_code, other.status_code, on_another_path.status_code) == (201, 201, 200)
    assert other.json()["id"] != first.json()["id"]


# --------------------------------------------------------------------------- validation failures
@pytest.mark.django_db
def test_a_failed_request_stores_nothing_so_the_key_can_be_used_once_fixed(
    tenant: Tenant,
) -> None:
    broken = create_body()
    broken["plan"]["agents"][0]["tasks"][0]["steps"][0]["tool"] = "nope"

    refused = post(tenant, RUNS, broken)
    fixed = post(tenant, RUNS, create_body())

    assert refused.status_code == 400
    assert refused.json()["code"] == "invalid_plan"
    assert fixed.status_code == 201
    assert IdempotencyRecord.objects.get().status == "completed"


@pytest.mark.django_db
def test_a_402_rolls_the_create_back_and_frees_the_key_for_after_a_top_up(
    new_tenant: Callable[..., Tenant],
) -> None:
    poor = new_tenant(credits=0)

    refused = post(poor, RUNS, create_body())
    credits_grant(organization=poor.organization, amount=10, reason="top up")
    accepted = post(poor, RUNS, create_body())

    assert refused.status_code == 402
    assert refused.json()["code"] == "insufficient_credits"
    assert accepted.status_code == 201
    assert Run.objects.filter(organization=poor.organization).count() == 1


@pytest.mark.django_db
def test_a_409_is_not_stored_either(tenant: Tenant) -> None:
    run = states.created(tenant.organization)
    path = f"{RUNS}/{run.pk}/pause"

    refused = post(tenant, path, {})
    run_start(run_id=run.pk)
    control.pick_up(run.pk)
    accepted = post(tenant, path, {})

    assert refused.status_code == 409
    assert accepted.status_code == 200
    assert accepted.json()["status"] == "paused"


@pytest.mark.django_db
@pytest.mark.parametrize("key", ["", "x" * 256, "tab\there", "caf\u00e9"])
def test_a_malformed_key_is_refused_with_400(tenant: Tenant, key: str) -> None:
    response = tenant.client.post(RUNS, create_body(), format="json", HTTP_IDEMPOTENCY_KEY=key)

    assert response.status_code == 400
    assert response.json()["code"] == "invalid_idempotency_key"
    assert not Run.objects.exists()


@pytest.mark.django_db
def test_a_key_of_255_characters_is_accepted(tenant: Tenant) -> None:
    assert post(tenant, RUNS, create_body(), key="k" * 255).status_code == 201


# --------------------------------------------------------------------------- in progress
@pytest.fixture
def blocked_create(
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[tuple[threading.Event, threading.Event]]:
    """The run's creation waits (inside the first request) until the test releases it."""
    entered, release = threading.Event(), threading.Event()
    real = services.run_create_checked

    def slow(**kwargs: Any) -> services.Created:
        entered.set()
        assert release.wait(30)
        return real(**kwargs)

    monkeypatch.setattr(services, "run_create_checked", slow)
    yield entered, release
    release.set()


@pytest.mark.django_db(transaction=True)
def test_the_same_key_while_the_first_request_runs_is_refused_with_409(
    blocked_create: tuple[threading.Event, threading.Event],
) -> None:
    entered, release = blocked_create
    tenant = make_tenant()
    responses: list[Any] = []

    def first() -> None:
        try:
            responses.append(post(tenant, RUNS, create_body()))
        finally:
            connection.close()

    thread = threading.Thread(target=first)
    thread.start()
    assert entered.wait(30)
    while_running = post(tenant, RUNS, create_body())
    different_body = post(tenant, RUNS, create_body("other"))
    release.set()
    thread.join(30)
    after = post(tenant, RUNS, create_body())

    assert while_running.status_code == different_body.status_code == 409
    assert while_running.json()["code"] == "idempotency_key_in_use"
    assert while_running.headers["Retry-After"] == "1"  # clients know when to retry
    assert responses[0].status_code == 201
    assert after.status_code == 200
    assert after.json() == responses[0].json()
    assert Run.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_twenty_concurrent_identical_posts_create_one_run_and_one_reservation() -> None:
    tenant = make_tenant()
    barrier = threading.Barrier(20, timeout=30)
    results: list[Any] = []
    lock = threading.Lock()

    def client() -> None:
        api = APIClient()
        api.credentials(HTTP_AUTHORIZATION=f"Bearer {tenant.key}")
        try:
            barrier.wait()
            response = api.post(
                RUNS, create_body(), format="json", headers={"Idempotency-Key": KEY}
            )
            with lock:
                results.append(response)
        finally:
            connection.close()

    threads = [threading.Thread(target=client) for _ in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)

    statuses = sorted(response.status_code for response in results)
    assert len(results) == 20
    assert statuses.count(201) == 1, statuses
    assert set(statuses) <= {200, 201, 409}, statuses
    created = next(r for r in results if r.status_code == 201).json()
    assert all(r.json() == created for r in results if r.status_code == 200)
    assert all(
        r.json()["code"] == "idempotency_key_in_use" for r in results if r.status_code == 409
    )
    assert Run.objects.filter(organization=tenant.organization).count() == 1
    assert LedgerEntry.objects.filter(organization=tenant.organization, type="reserve").count() == 1
    assert IdempotencyRecord.objects.get().status == "completed"


# --------------------------------------------------------------------------- expiry
@pytest.mark.django_db
def test_an_expired_record_counts_as_absent(tenant: Tenant) -> None:
    post(tenant, RUNS, create_body("yesterday"))
    IdempotencyRecord.objects.update(expires_at=timezone.now() - timedelta(seconds=1))

    response = post(tenant, RUNS, create_body("today"))

    assert response.status_code == 201
    assert response.json()["name"] == "today"
    assert Run.objects.count() == 2


@pytest.mark.django_db
def test_a_completed_record_is_kept_for_the_configured_ttl(tenant: Tenant, settings: Any) -> None:
    settings.IDEMPOTENCY_TTL_HOURS = 24
    post(tenant, RUNS, create_body())

    record = IdempotencyRecord.objects.get()

    assert record.status == "completed"
    assert record.response_status == 201
    expected = record.created_at + timedelta(hours=24)
    assert abs(record.expires_at - expected) < timedelta(minutes=1)
    assert (record.method, record.path, record.key) == ("POST", RUNS, KEY)
    assert record.fingerprint == fingerprint(create_body())


# --------------------------------------------------------------------------- the fingerprint
WEBHOOKS = "/api/v1/webhooks"


def webhook_create(secret: str) -> dict[str, Any]:
    return {**states.webhook_body(), "secret": secret}


@pytest.mark.django_db
def test_the_stored_fingerprint_of_a_body_holding_a_secret_is_keyed_by_the_server(
    tenant: Tenant, settings: Any
) -> None:
    body = webhook_create("whsec_a-guessable-secret-0001")
    assert post(tenant, WEBHOOKS, body).status_code == 201

    stored = IdempotencyRecord.objects.get().fingerprint

    # Whoever reads the row cannot confirm a guess of the secret by hashing the body.
    assert stored != hashlib.sha256(canonical_json(body)).hexdigest()
    assert stored == fingerprint(body)
    settings.SECRET_KEY = "another-server-" + "k" * 40
    assert fingerprint(body) != stored


def store_completed(tenant: Tenant, path: str, fingerprint: str, answer: Any) -> None:
    IdempotencyRecord.objects.create(
        organization=tenant.organization,
        method="POST",
        path=path,
        key=KEY,
        fingerprint=fingerprint,
        status="completed",
        response_status=201,
        response_body=answer,
        expires_at=timezone.now() + timedelta(hours=1),
    )


@pytest.mark.django_db
def test_a_record_stored_before_fingerprints_were_keyed_still_replays_its_body(
    tenant: Tenant,
) -> None:
    body = create_body()
    bare = hashlib.sha256(canonical_json(body)).hexdigest()
    store_completed(tenant, RUNS, bare, {"id": "first"})

    replayed = post(tenant, RUNS, body)
    other = post(tenant, RUNS, create_body("another"))

    assert (replayed.status_code, replayed.json()) == (200, {"id": "first"})
    assert replayed["Idempotent-Replayed"] == "true"
    assert (other.status_code, other.json()["code"]) == (422, "idempotency_key_reused")
    assert not Run.objects.exists()


@pytest.mark.django_db
def test_a_record_stored_under_a_rotated_secret_key_still_replays_its_body(
    tenant: Tenant, settings: Any
) -> None:
    body = create_body()
    old_key = settings.SECRET_KEY
    store_completed(tenant, RUNS, fingerprint(body), {"id": "first"})
    settings.SECRET_KEY = "the-new-server-key-" + "n" * 40
    settings.SECRET_KEY_FALLBACKS = [old_key]

    replayed = post(tenant, RUNS, body)

    assert (replayed.status_code, replayed.json()) == (200, {"id": "first"})
    settings.SECRET_KEY_FALLBACKS = []
    assert post(tenant, RUNS, body).json()["code"] == "idempotency_key_reused"


@pytest.mark.django_db
def test_a_claim_abandoned_by_a_killed_request_frees_the_key_after_its_lease(
    tenant: Tenant,
) -> None:
    scope = Scope(tenant.organization, "POST", RUNS, KEY)
    long_ago = timezone.now() - IN_PROGRESS_LEASE - timedelta(seconds=1)
    idempotency_claim(scope=scope, fingerprint=fingerprint(create_body()), now=long_ago)

    response = post(tenant, RUNS, create_body())

    assert response.status_code == 201


@pytest.mark.django_db
def test_a_slow_request_whose_claim_was_taken_over_cannot_store_its_response(
    tenant: Tenant,
) -> None:
    scope = Scope(tenant.organization, "POST", RUNS, KEY)
    long_ago = timezone.now() - IN_PROGRESS_LEASE - timedelta(seconds=1)
    slow = idempotency_claim(scope=scope, fingerprint="a" * 64, now=long_ago)
    fresh = idempotency_claim(scope=scope, fingerprint="a" * 64)

    assert isinstance(slow, Claim)
    assert isinstance(fresh, Claim)
    assert not idempotency_complete(claim=slow, response_status=201, response_body={})
    assert idempotency_complete(claim=fresh, response_status=201, response_body={})


@pytest.mark.django_db
def test_the_expiry_sweep_deletes_expired_rows_in_batches_and_is_idempotent(
    tenant: Tenant,
) -> None:
    now = timezone.now()
    for index in range(5):
        IdempotencyRecord.objects.create(
            organization=tenant.organization,
            method="POST",
            path=RUNS,
            key=f"old-{index}",
            fingerprint="f" * 64,
            status="completed",
            response_status=201,
            response_body={},
            expires_at=now - timedelta(minutes=index + 1),
        )
    kept = IdempotencyRecord.objects.create(
        organization=tenant.organization,
        method="POST",
        path=RUNS,
        key="fresh",
        fingerprint="f" * 64,
        expires_at=now + timedelta(hours=1),
    )

    assert idempotency_records_expire(now=now, batch=2) == 5
    assert idempotency_records_expire(now=now, batch=2) == 0
    assert list(IdempotencyRecord.objects.values_list("pk", flat=True)) == [kept.pk]


@pytest.mark.django_db
def test_a_post_without_a_key_is_not_idempotent_and_stores_nothing(tenant: Tenant) -> None:
    tenant.post(RUNS, create_body())
    tenant.post(RUNS, create_body())

    assert Run.objects.count() == 2
    assert not IdempotencyRecord.objects.exists()


def test_a_sealed_field_is_stored_encrypted_and_opened_for_the_replay(settings: Any) -> None:
    body = {"id": "w1", "secret": "whsec_abc", "url": "https://x.example/"}

    stored = seal(body, ["secret"])

    assert "whsec_abc" not in json.dumps(stored)
    assert stored["url"] == body["url"]
    assert unseal(stored, ["secret"]) == body
    assert unseal(body, ["secret"]) == body  # a record stored before: as it is
    # A key removed since: the replay answers null, never the sealed text.
    settings.SECRETS_ENCRYPTION_KEYS = [Fernet.generate_key().decode()]
    assert unseal(stored, ["secret"]) == {**body, "secret": None}
