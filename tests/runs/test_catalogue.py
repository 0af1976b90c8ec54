"""The catalogue of published tools: versions kept and refused, and a plan's steps checked
against the current version's schema at submission, before anything is stored."""

from __future__ import annotations

from typing import Any

import pytest

from runs import catalogue, services
from runs.models import PublishedTool, Run
from runs.plan import PlanInvalid, parse_plan
from tests import factories

pytestmark = pytest.mark.django_db

SUMMARIZE_SCHEMA = {
    "type": "object",
    "properties": {
        "text": {"type": "string"},
        "max_words": {"type": "integer", "default": 20},
        "style": {"enum": ["plain", "bright"]},
    },
    "required": ["text"],
    "additionalProperties": False,
}


def definition(name: str = "acme.summarize", version: str = "1", **changes: Any) -> Any:
    data = {
        "name": name,
        "version": version,
        "description": "Summarize a text.",
        "params_schema": SUMMARIZE_SCHEMA,
        "output_schema": {"type": "string"},
        "cost": {},
        **changes,
    }
    return catalogue.definition_from(data)


def tool_plan(params: dict[str, Any], tool: str = "acme.summarize") -> dict[str, Any]:
    spec = factories.plan(steps=1)
    spec["agents"][0]["tasks"][0]["steps"] = [{"name": "s1", "tool": tool, "params": params}]
    return spec


def problems(organization: Any, plan: dict[str, Any]) -> list[tuple[str, str]]:
    with pytest.raises(PlanInvalid) as refused:
        services.run_create(organization=organization, plan=plan)
    return [(e.path, e.message) for e in refused.value.errors]


def test_a_published_fleet_tool_is_accepted_with_params_that_fit_its_schema() -> None:
    catalogue.publish(organization=None, definitions=[definition()], by="worker-1")
    organization = factories.org()

    run = services.run_create(
        organization=organization, plan=tool_plan({"text": "hello", "max_words": 5})
    )

    assert Run.objects.filter(pk=run.pk).exists()


def test_a_param_that_does_not_fit_is_refused_with_its_path_and_nothing_is_stored() -> None:
    catalogue.publish(organization=None, definitions=[definition()], by="worker-1")
    organization = factories.org()

    found = problems(organization, tool_plan({"text": "hi", "max_words": "ten", "colour": 1}))

    path = "agents[0].tasks[0].steps[0].params"
    assert found == [
        (f"{path}.colour", "is not a parameter of the tool"),
        (f"{path}.max_words", "must be of type integer, got 'ten'"),
    ]
    assert not Run.objects.filter(organization=organization).exists()


def test_a_missing_required_param_and_a_value_outside_an_enum_are_refused() -> None:
    catalogue.publish(organization=None, definitions=[definition()], by="worker-1")

    found = problems(factories.org(), tool_plan({"style": "loud"}))

    path = "agents[0].tasks[0].steps[0].params"
    assert found == [
        (f"{path}.text", "is required"),
        (f"{path}.style", "must be one of 'plain', 'bright', got 'loud'"),
    ]


def test_a_templated_value_is_checked_when_rendered_not_at_submission() -> None:
    catalogue.publish(organization=None, definitions=[definition()], by="worker-1")
    spec = tool_plan({"text": "hi", "max_words": "${variables.n}"})
    spec["variables"] = {"n": 3}

    services.run_create(organization=factories.org(), plan=spec)


def test_an_unpublished_dotted_tool_is_refused_naming_what_is_published() -> None:
    catalogue.publish(organization=None, definitions=[definition()], by="worker-1")

    found = problems(factories.org(), tool_plan({"text": "x"}, tool="acme.summarise"))

    assert len(found) == 1
    path, message = found[0]
    assert path == "agents[0].tasks[0].steps[0].tool"
    assert "unknown tool 'acme.summarise'" in message
    assert "did you mean 'acme.summarize'" in message


def test_an_organizations_worker_tool_is_its_own() -> None:
    mine, theirs = factories.org(), factories.org()
    catalogue.publish(organization=mine, definitions=[definition("mine.tool")], by="rnr_1")

    services.run_create(organization=mine, plan=tool_plan({"text": "x"}, tool="mine.tool"))
    found = problems(theirs, tool_plan({"text": "x"}, tool="mine.tool"))

    assert "unknown tool 'mine.tool'" in found[0][1]


def test_a_worker_tools_params_may_not_read_a_secret() -> None:
    organization = factories.org()
    catalogue.publish(organization=organization, definitions=[definition("mine.tool")], by="r")

    found = problems(organization, tool_plan({"text": "${secrets.TOKEN}"}, tool="mine.tool"))

    assert found[0][0] == "agents[0].tasks[0].steps[0].params.text"
    assert "runs on your workers" in found[0][1]


def test_a_worker_tool_step_may_demand_tags_and_a_bad_demand_is_refused() -> None:
    organization = factories.org()
    catalogue.publish(organization=organization, definitions=[definition("mine.tool")], by="r")

    ok = {"text": "x", "demands": {"tags": ["gpu"], "hostname": "h1"}}
    services.run_create(organization=organization, plan=tool_plan(ok, tool="mine.tool"))
    found = problems(
        organization, tool_plan({"text": "x", "demands": {"tags": "gpu"}}, "mine.tool")
    )

    assert found == [
        ("agents[0].tasks[0].steps[0].params.demands.tags", "must be a list of strings")
    ]


def test_the_same_version_published_again_with_another_schema_is_refused() -> None:
    catalogue.publish(organization=None, definitions=[definition()], by="worker-1")
    changed = definition(params_schema={**SUMMARIZE_SCHEMA, "required": []})

    with pytest.raises(catalogue.ToolVersionConflict):
        catalogue.publish(organization=None, definitions=[changed], by="worker-2")
    catalogue.publish(organization=None, definitions=[definition()], by="worker-2")

    row = PublishedTool.objects.get(name="acme.summarize")
    assert set(row.published_by) == {"worker-1", "worker-2"}


def test_a_new_version_becomes_the_current_one_that_plans_are_checked_against() -> None:
    organization = factories.org()
    catalogue.publish(organization=organization, definitions=[definition("mine.tool")], by="r")
    renamed = {**SUMMARIZE_SCHEMA, "properties": {"body": {"type": "string"}}, "required": ["body"]}
    catalogue.publish(
        organization=organization,
        definitions=[definition("mine.tool", "2", params_schema=renamed)],
        by="r",
    )

    found = problems(organization, tool_plan({"text": "x"}, tool="mine.tool"))
    services.run_create(organization=organization, plan=tool_plan({"body": "x"}, "mine.tool"))

    assert ("agents[0].tasks[0].steps[0].params.body", "is required") in found
    current = catalogue.current_version(organization.pk, "mine.tool")
    assert current is not None
    assert current.version == "2"


def test_a_worker_cannot_offer_a_tool_of_the_fleet() -> None:
    catalogue.publish(organization=None, definitions=[definition()], by="worker-1")

    with pytest.raises(catalogue.ToolNameTaken):
        catalogue.publish(organization=factories.org(), definitions=[definition()], by="r")


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"name": "Summarize"}, "dotted and lower case"),
        ({"version": ""}, "version must be text"),
        ({"params_schema": {"type": "array"}}, "must describe an object"),
        ({"params_schema": {"type": "object", "properties": 3}}, "is not a JSON Schema"),
        ({"output_schema": []}, "output_schema must be a JSON Schema"),
    ],
)
def test_a_definition_that_cannot_be_kept_is_refused(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(catalogue.InvalidToolDefinition, match=message):
        definition(**changes)


def test_a_plan_read_again_without_a_catalogue_passes_a_published_name() -> None:
    parsed = parse_plan(tool_plan({"anything": 1}, tool="acme.not_checked_here"))

    assert parsed.agents[0].tasks[0].steps[0].tool == "acme.not_checked_here"


def test_a_plan_without_published_tools_reads_no_catalogue(
    django_assert_num_queries: Any,
) -> None:
    tools = catalogue.OrganizationCatalogue(factories.org().pk)

    with django_assert_num_queries(0):
        parse_plan(factories.plan(), tools=tools)
