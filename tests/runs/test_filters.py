"""The selectors filter with the FilterSets of runs.filters, for any caller: a query is
applied whole or refused with every problem named, never half-read."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.http import QueryDict
from django.utils import timezone

from common.filters import QueryInvalid
from runs import selectors, services
from runs.engine import control
from runs.filters import RunFilter
from runs.models import Run
from tests import factories
from tests.api import states

pytestmark = pytest.mark.django_db


def problems(query: dict[str, Any]) -> dict[str, list[str]]:
    return {
        name: [error.code or "" for error in errors]
        for name, errors in RunFilter(query).problems().items()
    }


def test_a_query_the_filters_do_not_know_is_refused_by_the_selector_itself() -> None:
    organization = factories.org()

    with pytest.raises(QueryInvalid) as refused:
        selectors.run_list(organization=organization, query={"stauts": "failed", "x": "1"})

    assert list(refused.value.problems) == ["stauts", "x"]


def test_an_unknown_parameter_is_reported_alone() -> None:
    assert problems({"priority": "high", "nmae": "x"}) == {"nmae": ["invalid"]}


@pytest.mark.parametrize(
    ("query", "code"),
    [
        ({"priority": ""}, "blank"),
        ({"priority": "10"}, "max_value"),
        ({"priority": "1.5"}, "invalid"),
        ({"status": ""}, "blank"),
        ({"status": ["running", "sleeping"]}, "invalid_choice"),
        ({"ordering": ""}, "blank"),
        ({"ordering": "priority,name"}, "invalid_choice"),  # one ordering, not a list
        ({"created_after": ""}, "blank"),
        ({"created_after": "yesterday"}, "invalid"),
        ({"created_before": "0001-01-01T00:00:00+01:00"}, "overflow"),
        ({"name": "x" * 201}, "max_length"),
    ],
)
def test_each_malformed_value_is_a_problem_of_its_parameter(
    query: dict[str, Any], code: str
) -> None:
    assert problems(query) == {next(iter(query)): [code]}


def test_an_empty_name_matches_every_run_as_it_always_has() -> None:
    organization = factories.org()
    runs = [factories.run(organization, name=name) for name in ("alpha", "beta")]

    listed = selectors.run_list(organization=organization, query={"name": ""})

    assert {run.pk for run in listed} == {run.pk for run in runs}


def test_status_repeats_and_a_repeated_single_parameter_keeps_its_last_value() -> None:
    organization = factories.org()
    created = states.created(organization)
    running = states.running(organization)
    failed = states.failed(organization)
    Run.objects.filter(pk=created.pk).update(priority=1)
    query = QueryDict("status=running&status=failed&status=created&priority=1&priority=5")

    listed = selectors.run_list(organization=organization, query=query)

    assert {run.pk for run in listed} == {running.pk, failed.pk}


def test_a_date_time_with_any_offset_is_compared_as_the_instant_it_names() -> None:
    organization = factories.org()
    run = factories.run(organization)
    moment = timezone.now().astimezone(UTC)
    Run.objects.filter(pk=run.pk).update(created_at=moment)
    # -21:19 is valid ISO 8601 but past what PostgreSQL accepts as an offset.
    offset = datetime.fromisoformat("2000-01-01T00:00:00-21:19").tzinfo
    just_after = (moment + timedelta(seconds=1)).astimezone(offset).isoformat()

    before = selectors.run_list(organization=organization, query={"created_before": just_after})
    after = selectors.run_list(organization=organization, query={"created_after": just_after})

    assert [row.pk for row in before] == [run.pk]
    assert list(after) == []


def test_runs_are_newest_first_unless_ordered_and_ties_break_by_id_the_same_way() -> None:
    organization = factories.org()
    runs = [factories.run(organization, priority=3) for _ in range(3)]
    Run.objects.filter(pk__in=[run.pk for run in runs]).update(created_at=timezone.now())
    by_id = sorted(run.pk for run in runs)

    newest = selectors.run_list(organization=organization)
    by_priority = selectors.run_list(organization=organization, query={"ordering": "-priority"})

    assert [run.pk for run in newest] == by_id[::-1]
    assert [run.pk for run in by_priority] == by_id[::-1]


def test_the_hierarchy_lists_the_current_attempt_unless_asked_for_another() -> None:
    organization = factories.org()
    run = states.failed(organization)
    services.run_retry(run_id=run.pk)
    control.pick_up(run.pk)
    run = Run.objects.get(pk=run.pk)
    assert run.attempt_number == 2

    _, current = selectors.steps_page(run=run, query={}, limit=100, offset=0)
    _, first = selectors.steps_page(run=run, query={"attempt": 1}, limit=100, offset=0)
    agents = selectors.agent_list(run=run, query={"attempt": 1})
    tasks = selectors.task_list(run=run)

    assert {step["attempt_number"] for step in current} == {2}
    assert {step["attempt_number"] for step in first} == {1}
    assert len(current) == len(first) == 2
    assert [agent.attempt_number for agent in agents] == [1]
    assert [task.attempt_number for task in tasks] == [2]


def test_events_follow_from_an_id_by_kind_and_attempt() -> None:
    run = states.failed(factories.org())
    events = selectors.events_page(run=run, query={}, limit=100)

    later = selectors.events_page(run=run, query={"after": events[1]["id"]}, limit=100)
    transitions = selectors.events_page(
        run=run, query={"kind": "transition", "attempt": 1}, limit=100
    )

    assert later == events[2:]
    assert {(event["kind"], event["attempt_number"]) for event in transitions} == {
        ("transition", 1)
    }
