"""A run's events are paginated by cursor (keyset on the event id): `next` and `previous`
links, no count, one query a page whatever the length of the history."""

from __future__ import annotations

import base64
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from django.core import signing
from django.db import connection
from django.test.utils import CaptureQueriesContext

from api.pagination import CURSOR_SALT, Cursor
from common.filters import MAX_BIGINT
from runs.models import Run, RunEvent
from runs.selectors import run_history
from runs.transitions import claim_next_step
from tests.api import states
from tests.tenants import Tenant

pytestmark = pytest.mark.django_db


def events_path(run: Run) -> str:
    return f"/api/v1/runs/{run.pk}/events"


def add_events(run: Run, count: int, kind: str = "operator", attempt: int = 1) -> None:
    RunEvent.objects.bulk_create(
        RunEvent(
            run=run,
            attempt_number=attempt,
            entity="run",
            entity_id=str(run.pk),
            kind=kind,
            message=f"note {index}",
        )
        for index in range(count)
    )


def all_ids(run: Run) -> list[int]:
    return list(run_history(run).order_by("id").values_list("id", flat=True))


def follow(tenant: Tenant, link: str) -> Any:
    """GET a `next` or `previous` link exactly as the API gave it."""
    response = tenant.client.get(link)
    assert response.status_code == 200, response.json()
    return response.json()


def walk_forward(tenant: Tenant, first: dict[str, Any]) -> list[dict[str, Any]]:
    pages = [first]
    while pages[-1]["next"]:
        pages.append(follow(tenant, pages[-1]["next"]))
    return pages


def test_following_next_reads_every_event_once_oldest_first_with_no_count(
    tenant: Tenant,
) -> None:
    run = states.running(tenant.organization)
    add_events(run, 7)

    first = tenant.get(events_path(run), {"page_size": 3}).json()
    pages = walk_forward(tenant, first)

    assert set(first) == {"next", "previous", "results"}
    assert [len(page["results"]) for page in pages][:-1] == [3] * (len(pages) - 1)
    assert [event["id"] for page in pages for event in page["results"]] == all_ids(run)
    assert first["previous"] is None
    assert all(page["previous"] for page in pages[1:])
    assert pages[-1]["next"] is None
    # Every link keeps the page size (and any filter) and carries an opaque cursor.
    assert parse_qs(urlsplit(first["next"]).query)["page_size"] == ["3"]


def test_following_previous_reads_the_same_pages_back(tenant: Tenant) -> None:
    run = states.running(tenant.organization)
    add_events(run, 8)
    pages = walk_forward(tenant, tenant.get(events_path(run), {"page_size": 3}).json())

    back = [pages[-1]]
    while back[-1]["previous"]:
        back.append(follow(tenant, back[-1]["previous"]))

    assert [page["results"] for page in reversed(back)] == [page["results"] for page in pages]
    assert back[-1]["next"] == pages[0]["next"]


def test_filters_hold_across_pages(tenant: Tenant) -> None:
    run = states.running(tenant.organization)
    add_events(run, 4, kind="operator")
    add_events(run, 4, kind="approval", attempt=2)
    add_events(run, 4, kind="operator")
    first_operator = run_history(run).filter(kind="operator").order_by("id")[0].id

    first = tenant.get(
        events_path(run), {"kind": "operator", "after": first_operator, "page_size": 2}
    ).json()
    rows = [event for page in walk_forward(tenant, first) for event in page["results"]]
    second_attempt = tenant.get(events_path(run), {"attempt": 2, "page_size": 500}).json()

    assert [event["id"] for event in rows] == list(
        run_history(run)
        .filter(kind="operator", id__gt=first_operator)
        .order_by("id")
        .values_list("id", flat=True)
    )
    assert {event["kind"] for event in second_attempt["results"]} == {"approval"}
    assert len(second_attempt["results"]) == 4


def test_the_page_size_is_capped_as_on_every_list(tenant: Tenant, settings: Any) -> None:
    settings.API_MAX_PAGE_SIZE = 4
    run = states.running(tenant.organization)
    add_events(run, 10)

    body = tenant.get(events_path(run), {"page_size": 1000}).json()

    assert len(body["results"]) == 4
    assert body["next"]


def test_a_page_costs_one_query_that_never_counts_whatever_the_history(tenant: Tenant) -> None:
    short = states.running(tenant.organization)
    long = states.running(tenant.organization)
    add_events(long, 1000)
    tenant.get("/api/v1/runs")  # the key's last_used_at is written at most once a minute

    def captured(run: Run, **params: Any) -> list[str]:
        with CaptureQueriesContext(connection) as queries:
            response = tenant.get(events_path(run), {"page_size": 50, **params})
            assert response.status_code == 200
        return [query["sql"] for query in queries.captured_queries]

    first_short, first_long = captured(short), captured(long)
    near_the_end = all_ids(long)[-60]
    deep_long = captured(long, cursor=Cursor(near_the_end).encode())
    back_long = captured(long, cursor=Cursor(near_the_end, before=True).encode())

    assert len(first_short) == len(first_long) == len(deep_long) == len(back_long)
    every = first_short + first_long + deep_long + back_long
    assert not [sql for sql in every if "COUNT(" in sql.upper()]
    # One query reads the page, by key (an OFFSET would scan every row before it).
    event_queries = [sql for sql in deep_long if "runs.run_history" in sql]
    assert len(event_queries) == 1
    assert "OFFSET" not in event_queries[0].upper()


def test_page_is_refused_with_the_way_to_the_next_page(tenant: Tenant) -> None:
    run = states.running(tenant.organization)

    response = tenant.get(events_path(run), {"page": 2})

    body = response.json()
    assert response.status_code == 400
    assert body["code"] == "invalid_request"
    assert body["details"][0]["path"] == "page"
    assert "follow the `next` link" in body["message"]


def real_cursor(tenant: Tenant, run: Run) -> str:
    link: str = tenant.get(events_path(run), {"page_size": 1}).json()["next"]
    return parse_qs(urlsplit(link).query)["cursor"][0]


def signed(value: object, salt: str = CURSOR_SALT) -> str:
    """Signed as the API signs cursors: right key, but a payload it never writes."""
    return str(signing.Signer(salt=salt, sep=".").sign_object(value))


def edited_payload(cursor: str) -> str:
    payload, signature = cursor.split(".")
    other = base64.urlsafe_b64encode(b'["after",1]').decode().rstrip("=")
    assert other != payload
    return f"{other}.{signature}"


def edited_signature(cursor: str) -> str:
    return cursor[:-1] + ("A" if cursor[-1] != "A" else "B")


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda real: "", id="empty"),
        pytest.param(lambda real: "not a cursor", id="text"),
        pytest.param(lambda real: "%%%%", id="percent-signs"),
        pytest.param(lambda real: "A" * 500, id="too-long"),
        pytest.param(lambda real: base64.urlsafe_b64encode(b'["after",1]').decode(), id="unsigned"),
        pytest.param(lambda real: real[:-3], id="cut"),
        pytest.param(edited_payload, id="edited-payload"),
        pytest.param(edited_signature, id="edited-signature"),
        pytest.param(lambda real: signed(["after", 1], salt="another.purpose"), id="other-salt"),
        pytest.param(lambda real: signed(["sideways", 1]), id="signed-unknown-side"),
        pytest.param(lambda real: signed(["after", 0]), id="signed-zero"),
        pytest.param(lambda real: signed(["after", "12"]), id="signed-string-key"),
        pytest.param(lambda real: signed(["after", 2**63]), id="signed-past-bigint"),
        pytest.param(lambda real: signed({"after": 1}), id="signed-object"),
    ],
)
def test_a_malformed_or_edited_cursor_is_400_never_a_crash(tenant: Tenant, make: Any) -> None:
    run = states.running(tenant.organization)
    cursor = make(real_cursor(tenant, run))

    response = tenant.get(events_path(run), {"cursor": cursor})

    assert response.status_code == 400, response.content
    assert response.json()["code"] == "invalid_request"
    assert response.json()["details"][0]["path"] == "cursor"


def test_a_cursor_past_the_end_is_an_empty_page_not_an_error(tenant: Tenant) -> None:
    run = states.running(tenant.organization)

    body = tenant.get(events_path(run), {"cursor": Cursor(MAX_BIGINT).encode()}).json()

    assert body == {"next": None, "previous": None, "results": []}


def test_events_name_their_entity_by_its_path_in_the_plan(tenant: Tenant) -> None:
    spec = {
        "name": "paths",
        "agents": [
            {
                "name": "researcher",
                "tasks": [{"name": "fetch", "steps": [{"name": "topic", "tool": "noop"}]}],
            }
        ],
    }
    run = states.running_plan(tenant.organization, spec)
    claimed = claim_next_step(run.pk, worker="w", task_id="t", lease_seconds=60)
    assert claimed is not None  # its step now RUNNING: an event of the step

    events = tenant.get(events_path(run), {"page_size": 500}).json()["results"]

    by_entity = {(event["entity"], event["path"]) for event in events}
    assert ("run", "") in by_entity
    assert ("agent", "researcher") in by_entity
    assert ("task", "researcher.fetch") in by_entity
    assert ("step", "researcher.fetch.topic") in by_entity
