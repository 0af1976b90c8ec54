"""Plans as YAML (`Content-Type: application/yaml`): the same `{plan, start}` body as
JSON, the same validation and error paths; safe loading only, no aliases, nothing JSON
could not say, the same size bounds; nothing is stored when it is refused."""

from __future__ import annotations

from typing import Any

import pytest

from runs.models import Run
from tests.tenants import Tenant

pytestmark = pytest.mark.django_db

PLAN = """\
plan:
  name: from-yaml
  priority: 3
  variables:
    topic: AI chips
  agents:
    - name: researcher
      tasks:
        - name: fetch
          steps:
            - name: topic
              tool: echo
              params:
                topic: ${variables.topic}
            - {name: pause, tool: sleep, params: {seconds: 0.1}}
start: true
"""


def post_yaml(tenant: Tenant, body: str, **headers: str) -> Any:
    return tenant.client.post(
        "/api/v1/runs",
        data=body.encode(),
        content_type="application/yaml",
        headers=headers or None,
    )


def test_a_yaml_plan_creates_and_starts_the_same_run_as_json(tenant: Tenant) -> None:
    response = post_yaml(tenant, PLAN)

    assert response.status_code == 201, response.json()
    run = Run.objects.get(pk=response.json()["id"])
    assert (run.name, run.priority, run.status) == ("from-yaml", 3, "pending")
    assert run.variables == {"topic": "AI chips"}
    steps = run.plan["agents"][0]["tasks"][0]["steps"]
    assert steps[0]["params"] == {"topic": "${variables.topic}"}
    assert steps[1] == {"name": "pause", "tool": "sleep", "params": {"seconds": 0.1}}


def test_an_invalid_yaml_plan_gets_the_same_invalid_plan_errors(tenant: Tenant) -> None:
    body = PLAN.replace("tool: echo", "tool: no-such-tool")

    response = post_yaml(tenant, body)

    assert response.status_code == 400
    assert response.json()["code"] == "invalid_plan"
    paths = [problem["path"] for problem in response.json()["details"]]
    assert "agents[0].tasks[0].steps[0].tool" in paths
    assert not Run.objects.exists()


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("plan: [unclosed\n", "YAML parse error"),
        ("base: &b {name: x}\nplan: *b\n", "aliases (*name) are not accepted"),
        ("plan: !!python/object:os.system {}\n", "YAML parse error"),
        ("plan:\n  name: when\n  at: 2026-11-24\n", "only JSON's types are accepted, not date"),
        ("plan:\n  1: one\n", "keys must be text"),
        ("plan:\n  ratio: .nan\n", "numbers must be finite"),
        ('plan: {name: "a\\0b"}\n', "NUL characters"),
    ],
)
def test_yaml_that_json_could_not_say_is_refused_as_invalid_yaml(
    tenant: Tenant, body: str, message: str
) -> None:
    response = post_yaml(tenant, body)

    assert response.status_code == 400
    assert response.json()["code"] in {"invalid_yaml"}
    assert message in response.json()["message"]
    assert not Run.objects.exists()


def test_yaml_is_held_to_the_body_size_limit(tenant: Tenant, settings: Any) -> None:
    settings.API_MAX_BODY_BYTES = 1000
    body = PLAN + "# " + "x" * 2000 + "\n"

    response = post_yaml(tenant, body)

    assert response.status_code == 413
    assert response.json()["code"] == "payload_too_large"


def test_yaml_is_only_for_creating_runs(tenant: Tenant) -> None:
    created = post_yaml(tenant, PLAN.replace("start: true", "start: false")).json()

    response = tenant.client.post(
        f"/api/v1/runs/{created['id']}/cancel",
        data=b"reason: no\n",
        content_type="application/yaml",
    )

    assert response.status_code == 415
    assert response.json()["code"] == "unsupported_media_type"


def test_a_yaml_create_is_idempotent_like_json(tenant: Tenant) -> None:
    first = post_yaml(tenant, PLAN, **{"Idempotency-Key": "yaml-1"})
    again = post_yaml(tenant, PLAN, **{"Idempotency-Key": "yaml-1"})

    assert first.status_code == 201
    assert again.status_code == 200
    assert again.json()["id"] == first.json()["id"]
    assert Run.objects.count() == 1
