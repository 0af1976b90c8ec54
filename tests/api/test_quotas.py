"""Quotas over real HTTP (pytest-django's live server, the real PostgreSQL and Redis):
each at its limit (`409 quota_exceeded`, `429 too_many_streams`, the exact body), shown
with its use at `GET /api/v1/organization`; an event stream counted only while open, and
ended at the first heartbeat after its key is revoked or its organization suspended."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from billing import quotas
from billing.models import ApiKey, Organization
from billing.services import api_key_revoke
from common.eventstreams import streams_open
from runs.models import Run
from runs.selectors import run_history
from schedules.models import Schedule
from tests import factories
from tests.api.sse import Block, blocks, open_stream, stream_url
from tests.schedules.conftest import scheduled_plan
from tests.support import wait_until
from tests.tenants import LiveTenant
from webhooks.models import WebhookEndpoint

pytestmark = pytest.mark.django_db(transaction=True)

HOOK = {"url": "https://hooks.example.com/in", "events": ["run.completed"]}


def schedule(name: str) -> dict[str, Any]:
    return {"name": name, "plan": scheduled_plan(), "interval": "1h"}


# --------------------------------------------------------------------------- creates
def test_one_webhook_endpoint_past_the_quota_is_409_and_a_deleted_one_frees_its_place(
    live: LiveTenant,
) -> None:
    quotas.quotas_set(live.organization.pk, actor="test", webhook_endpoints=2)
    created = [live.call("POST", "webhooks", HOOK) for _ in range(2)]
    assert [response.status_code for response in created] == [201, 201]

    refused = live.call("POST", "webhooks", HOOK)

    assert refused.status_code == 409
    assert refused.json() == {
        "code": "quota_exceeded",
        "message": "the organization has 2 webhook endpoints, its quota; delete one, or ask "
        "an operator to raise the quota",
        "details": {"quota": "webhook_endpoints", "limit": 2},
    }
    assert WebhookEndpoint.objects.filter(organization=live.organization).count() == 2
    assert live.call("DELETE", f"webhooks/{created[0].json()['id']}").status_code == 204
    assert live.call("POST", "webhooks", HOOK).status_code == 201


def test_one_schedule_past_the_quota_is_409(live: LiveTenant, settings: Any) -> None:
    settings.QUOTA_SCHEDULES = 1  # the default, for an organization without its own
    assert live.call("POST", "schedules", schedule("first")).status_code == 201

    refused = live.call("POST", "schedules", schedule("second"))

    assert refused.status_code == 409
    assert refused.json() == {
        "code": "quota_exceeded",
        "message": "the organization has 1 schedules, its quota; delete one, or ask an "
        "operator to raise the quota",
        "details": {"quota": "schedules", "limit": 1},
    }
    assert list(Schedule.objects.values_list("name", flat=True)) == ["first"]


def test_a_new_rate_limit_past_the_quota_is_409_but_a_change_never_is(live: LiveTenant) -> None:
    quotas.quotas_set(live.organization.pk, actor="test", rate_limits=1)
    assert live.call("PUT", "rate-limits/openai", {"limit": 5, "period": "1s"}).status_code == 201

    refused = live.call("PUT", "rate-limits/anthropic", {"limit": 5, "period": "1s"})
    changed = live.call("PUT", "rate-limits/openai", {"limit": 9, "period": "1s"})

    assert refused.status_code == 409
    assert refused.json() == {
        "code": "quota_exceeded",
        "message": "the organization has 1 rate limits, its quota; delete one, or ask an "
        "operator to raise the quota",
        "details": {"quota": "rate_limits", "limit": 1},
    }
    assert (changed.status_code, changed.json()["limit"]) == (200, 9)


def test_the_organization_shows_each_quota_in_force_and_its_use(
    live: LiveTenant, settings: Any
) -> None:
    settings.API_STREAM_HEARTBEAT_S = 0.2  # the server sees the stream closed at once
    settings.QUOTA_SCHEDULES = 40
    quotas.quotas_set(live.organization.pk, actor="test", webhook_endpoints=5, event_streams=2)
    assert live.call("POST", "webhooks", HOOK).status_code == 201
    assert live.call("POST", "schedules", schedule("nightly")).status_code == 201
    run = factories.run(live.organization)  # created: its stream stays open

    with (
        httpx.Client(timeout=10) as http,
        open_stream(http, live.url, run.pk, live.key, headers=quiet(run)) as opened,
    ):
        assert opened.status_code == 200
        shown = live.call("GET", "organization").json()["quotas"]

    assert shown == {
        "webhook_endpoints": {"limit": 5, "used": 1},
        "schedules": {"limit": 40, "used": 1},
        "rate_limits": {"limit": settings.QUOTA_RATE_LIMITS, "used": 0},
        "event_streams": {"limit": 2, "used": 1},
        "runner_polls": {"limit": settings.QUOTA_RUNNER_POLLS, "used": 0},
        "webhooks_in_flight": {"limit": settings.QUOTA_WEBHOOKS_IN_FLIGHT, "used": 0},
        "artifacts": {"limit": settings.QUOTA_ARTIFACTS, "used": 0},
        "artifact_bytes": {"limit": settings.QUOTA_ARTIFACT_BYTES, "used": 0},
        "parked_waits": {"limit": settings.QUOTA_PARKED_WAITS, "used": 0},
    }
    wait_until(lambda: streams_open(live.organization.pk) == 0, what="the stream's release")


# --------------------------------------------------------------------------- streams
def quiet(run: Run) -> dict[str, str]:
    """Resume after the run's last event: the stream of a run nothing happens to sends
    only keep-alives."""
    return {"Last-Event-ID": str(run_history(run).latest("id").pk)}


def _keepalives_until_the_end(received: Iterator[Block], most: int) -> int:
    """Read to the stream's end; how many keep-alives came first (fail past ``most``:
    a stream that does not end sends them for ever)."""
    count = 0
    for block in received:
        assert block.keepalive
        count += 1
        assert count <= most, "the stream went on"
    return count


def test_one_stream_past_the_quota_is_429_and_a_closed_one_frees_its_place(
    live: LiveTenant, settings: Any
) -> None:
    settings.API_STREAM_HEARTBEAT_S = 0.2  # the server sees a closed stream at its next one
    quotas.quotas_set(live.organization.pk, actor="test", event_streams=1)
    run = factories.run(live.organization)

    with httpx.Client(timeout=10) as http:
        with open_stream(http, live.url, run.pk, live.key, headers=quiet(run)) as first:
            assert first.status_code == 200
            next(blocks(first.iter_lines()))  # open on the server
            with open_stream(http, live.url, run.pk, live.key, headers=quiet(run)) as second:
                refused = (second.status_code, second.headers.get("Retry-After"), second.read())
        wait_until(
            lambda: streams_open(live.organization.pk) == 0, what="the closed stream's release"
        )
        with open_stream(http, live.url, run.pk, live.key, headers=quiet(run)) as again:
            assert again.status_code == 200
    wait_until(lambda: streams_open(live.organization.pk) == 0, what="the stream's release")

    assert refused[:2] == (429, "1")
    assert json.loads(refused[2]) == {
        "code": "too_many_streams",
        "message": "the organization has 1 event streams open, its quota; close one, or "
        "retry in 1 s",
        "details": {"quota": "event_streams", "limit": 1, "retry_after": 1},
    }


def test_a_stream_never_started_is_released_when_the_server_closes_it() -> None:
    organization, key = factories.org_with_key()
    run = factories.run(organization)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")

    response = client.get(stream_url("", run.pk), HTTP_ACCEPT="text/event-stream")
    assert (response.status_code, streams_open(organization.pk)) == (200, 1)
    response.close()  # what the WSGI server does, whether or not it sent a frame

    assert streams_open(organization.pk) == 0


def test_a_revoked_keys_stream_ends_at_the_next_heartbeat_and_frees_its_place(
    live: LiveTenant, settings: Any
) -> None:
    settings.API_STREAM_HEARTBEAT_S = 0.2
    run = factories.run(live.organization)

    with (
        httpx.Client(timeout=10) as http,
        open_stream(http, live.url, run.pk, live.key, headers=quiet(run)) as response,
    ):
        received = blocks(response.iter_lines())
        assert next(received).keepalive
        assert streams_open(live.organization.pk) == 1
        api_key_revoke(api_key=ApiKey.objects.get(organization=live.organization))
        # A heartbeat already under way may still go out; the next one ends it.
        _keepalives_until_the_end(received, most=2)

    wait_until(lambda: streams_open(live.organization.pk) == 0, what="the stream's release")
    assert live.call("GET", f"runs/{run.pk}/events/stream").status_code == 401


def test_a_suspended_organizations_stream_ends_at_the_next_heartbeat(
    live: LiveTenant, settings: Any
) -> None:
    settings.API_STREAM_HEARTBEAT_S = 0.2
    run = factories.run(live.organization)

    with (
        httpx.Client(timeout=10) as http,
        open_stream(http, live.url, run.pk, live.key, headers=quiet(run)) as response,
    ):
        received = blocks(response.iter_lines())
        assert next(received).keepalive
        Organization.objects.filter(pk=live.organization.pk).update(suspended_at=timezone.now())
        _keepalives_until_the_end(received, most=2)

    wait_until(lambda: streams_open(live.organization.pk) == 0, what="the stream's release")


def test_a_stream_goes_on_while_its_key_and_organization_stand(
    live: LiveTenant, settings: Any
) -> None:
    """The check at each heartbeat refuses nothing else: another key revoked, another
    organization suspended."""
    settings.API_STREAM_HEARTBEAT_S = 0.2
    run = factories.run(live.organization)
    other, _ = factories.org_with_key()

    with (
        httpx.Client(timeout=10) as http,
        open_stream(http, live.url, run.pk, live.key, headers=quiet(run)) as response,
    ):
        received = blocks(response.iter_lines())
        assert next(received).keepalive
        Organization.objects.filter(pk=other.pk).update(suspended_at=timezone.now())
        api_key_revoke(api_key=ApiKey.objects.get(organization=other))
        heard = [next(received) for _ in range(5)]  # five heartbeats, still open

    assert all(block.keepalive for block in heard)
    wait_until(lambda: streams_open(live.organization.pk) == 0, what="the stream's release")
