"""The Python client's webhook methods against the real API (pytest-django's live
server, as tests/client does)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from orchestrator_client import Client
from orchestrator_client.errors import ApiError
from tests import factories

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def client(live_server: Any) -> Iterator[Client]:
    _, key = factories.org_with_key()
    with Client(live_server.url, key, timeout=10) as api:
        yield api


def test_the_client_registers_changes_pings_and_deletes_an_endpoint(client: Client) -> None:
    created = client.create_webhook("https://hooks.example.com/in", events=["run.completed"])
    assert created["secret"].startswith("whsec_")

    assert [hook["id"] for hook in client.webhooks()] == [created["id"]]
    assert "secret" not in client.webhook(created["id"])
    changed = client.update_webhook(created["id"], events=["run.failed"], enabled=False)
    assert (changed["events"], changed["enabled"]) == (["run.failed"], False)
    ping = client.test_webhook(created["id"])
    assert (ping["type"], ping["status"]) == ("webhook.test", "pending")
    again = client.redeliver_webhook(created["id"], ping["id"])
    assert again["id"] == ping["id"]
    assert [d["id"] for d in client.webhook_deliveries(created["id"])] == [ping["id"]]
    client.delete_webhook(created["id"])
    with pytest.raises(ApiError) as refused:
        client.webhook(created["id"])
    assert refused.value.status == 404


def test_bad_input_is_refused_with_the_field(client: Client) -> None:
    with pytest.raises(ApiError) as refused:
        client.create_webhook("ftp://nope", events=["run.completed"])
    assert refused.value.code == "invalid_request"
