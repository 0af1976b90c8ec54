"""A schedule's body around a plan file's text, as `orch schedules create` sends it: the
fields beside the plan read back as they were given, in JSON and in YAML."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from orchestrator_client.plans import (
    at_plan_positions,
    json_body,
    json_body_with,
    yaml_body,
    yaml_body_with,
)

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

    assert json_body(PLAN_JSON, start=start) == f'{{"start": {flag}, "plan": {PLAN_JSON}}}'
    assert yaml_body(PLAN_YAML, start=start).startswith(f"start: {flag}\nplan:\n  name: report")


# --------------------------------------------------------------------------- parse errors
# Files a parser refuses, and where: the positions the API's message gives for the wrapped
# body, read back by the client, are those a parser of the file alone gives.
BROKEN_YAML = [
    "name: [unclosed\n",
    "name: x\nfoo: : :\n",
    "name: x\nagents:\n  - name: a\n   bad: 1\n",
    "%YAML 1.1\n---\nname: x\nb: [\n",
    '# a comment\n\nname: x\nnote: |\n  text\nbad: "unclosed\n',
]
BROKEN_JSON = ['{"name": ', '\n\n{"name": "x",\n  "agents": [\n}\n', '{"name": "x" "y"}']


def yaml_error(text: str) -> str:
    with pytest.raises(yaml.YAMLError) as refused:
        yaml.safe_load(text)
    return str(refused.value)


def json_error(text: str) -> str:
    with pytest.raises(json.JSONDecodeError) as refused:
        json.loads(text)
    return str(refused.value)


@pytest.mark.parametrize("fields", [{"start": True}, FIELDS])
@pytest.mark.parametrize("text", BROKEN_YAML)
def test_a_yaml_error_is_placed_at_the_files_own_line_and_column(
    text: str, fields: dict[str, Any]
) -> None:
    answered = f"YAML parse error: {yaml_error(yaml_body_with(text, fields))}"

    placed = at_plan_positions(answered, format="yaml", fields=fields)

    alone = yaml_error(text).replace('in "<unicode string>", line', "in the plan, line")
    assert placed == f"YAML parse error: {alone}"


def test_a_two_line_file_is_never_said_to_be_wrong_at_line_5() -> None:
    text = "name: x\nfoo: : :\n"
    answered = yaml_error(yaml_body_with(text, {"name": "n", "cron": "0 * * * *"}))
    assert "line 5, column 8" in answered

    placed = at_plan_positions(answered, format="yaml", fields={"name": "n", "cron": "0 * * * *"})

    assert placed == (
        "mapping values are not allowed here\n"
        "  in the plan, line 2, column 6:\n"
        "    foo: : :\n"
        "         ^"
    )


@pytest.mark.parametrize("fields", [{"start": False}, FIELDS])
@pytest.mark.parametrize("text", BROKEN_JSON)
def test_a_json_error_is_placed_at_the_files_own_line_and_column(
    text: str, fields: dict[str, Any]
) -> None:
    answered = f"JSON parse error: {json_error(json_body_with(text, fields))}"

    placed = at_plan_positions(answered, format="json", fields=fields)

    assert placed == f"JSON parse error: {json_error(text)}"
