"""A schedule's body around a plan file's text, as `orch schedules create` sends it: the
fields beside the plan read back as they were given, in JSON and in YAML."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from orchestrator_client.plans import json_body, json_body_with, yaml_body, yaml_body_with

FIELDS: dict[str, Any] = {
    "name": 'nightly "report" \\ é \U0001f600 \u2028\x85\t\n',
    "cron": "30 2 * * *",
    "interval": None,
    "variables": {"day": "yesterday", "list": [1, 2.5, True, None], "nested": {"k": "v"}},
}
PLAN_YAML = "name: report  # the plan\nagents:\n  - name: a\n    tasks: []\n"
PLAN_JSON = '{"name": "report", "agents": [{"name": "a", "tasks": []}]}'


def test_fields_and_plan_read_back_from_yaml() -> None:
    body = yaml.safe_load(yaml_body_with(PLAN_YAML, FIELDS))

    assert body == {**FIELDS, "plan": {"name": "report", "agents": [{"name": "a", "tasks": []}]}}


def test_fields_and_plan_read_back_from_json() -> None:
    body = json.loads(json_body_with(PLAN_JSON, FIELDS))

    assert body == {**FIELDS, "plan": json.loads(PLAN_JSON)}


@pytest.mark.parametrize("start", [True, False])
def test_a_runs_body_is_written_as_it_was(start: bool) -> None:
    flag = "true" if start else "false"

    assert json_body(PLAN_JSON, start=start) == f'{{"start": {flag}, "plan": {PLAN_JSON}\n}}'
    assert yaml_body(PLAN_YAML, start=start).startswith(f"start: {flag}\nplan:\n  name: report")
