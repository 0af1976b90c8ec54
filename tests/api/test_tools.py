"""GET /api/v1/tools: the published tools an organization may name, with their schemas,
versions and who offers them; POST /runs refusing a step whose params do not fit."""

from __future__ import annotations

import pytest

from tests.api.states import SCHEMA, publish_tool
from tests.tenants import Tenant

pytestmark = pytest.mark.django_db


def test_the_list_shows_the_fleets_tools_and_the_organizations_own(
    tenant: Tenant, other_tenant: Tenant
) -> None:
    publish_tool(None, "acme.word_stats", by="celery@host-a")
    publish_tool(tenant.organization, "mine.summarize")
    publish_tool(tenant.organization, "mine.summarize", version="2")
    publish_tool(other_tenant.organization, "theirs.secret_sauce")

    response = tenant.get("/api/v1/tools")

    assert response.status_code == 200, response.json()
    body = response.json()
    assert body["count"] == 2
    tools = {tool["name"]: tool for tool in body["results"]}
    assert set(tools) == {"acme.word_stats", "mine.summarize"}
    fleet = tools["acme.word_stats"]
    assert (fleet["placement"], fleet["version"], fleet["cost"]) == (
        "fleet",
        "1",
        {"credits": "0.01"},
    )
    assert fleet["params_schema"] == SCHEMA
    assert [(o["placement"], o["worker"]) for o in fleet["offered_by"]] == [
        ("fleet", "celery@host-a")
    ]
    mine = tools["mine.summarize"]
    assert (mine["placement"], mine["version"]) == ("worker", "2")
    assert [v["version"] for v in mine["versions"]] == ["2", "1"]
    assert mine["description"] == "mine.summarize, version 2"


def test_one_tool_is_shown_by_name_and_another_organizations_is_not_found(
    tenant: Tenant, other_tenant: Tenant
) -> None:
    publish_tool(other_tenant.organization, "theirs.tool")
    publish_tool(tenant.organization, "mine.tool")

    assert tenant.get("/api/v1/tools/mine.tool").json()["name"] == "mine.tool"
    missing = tenant.get("/api/v1/tools/theirs.tool")

    assert missing.status_code == 404
    assert missing.json()["code"] == "not_found"


def test_a_run_whose_step_does_not_fit_the_tools_schema_is_refused_with_the_path(
    tenant: Tenant,
) -> None:
    publish_tool(None, "acme.word_stats")
    plan = {
        "name": "stats",
        "agents": [
            {
                "name": "a",
                "tasks": [
                    {
                        "name": "t",
                        "steps": [{"name": "s", "tool": "acme.word_stats", "params": {"text": 42}}],
                    }
                ],
            }
        ],
    }

    response = tenant.post("/api/v1/runs", {"plan": plan})

    assert response.status_code == 400
    body = response.json()
    assert body["code"] == "invalid_plan"
    assert body["details"] == [
        {
            "path": "agents[0].tasks[0].steps[0].params.text",
            "message": "must be of type string, got 42",
        }
    ]
    assert tenant.get("/api/v1/runs").json()["count"] == 0
