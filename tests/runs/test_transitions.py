"""Every (from, to) pair of every transition table, exhaustively."""

from __future__ import annotations

from typing import Any

import pytest

from runs.models import Agent, Run, RunEvent, Step, Task
from runs.states import TABLES, InvalidTransition, NodeStatus, RunStatus, StepStatus
from runs.transitions import transition
from tests.factories import hierarchy

pytestmark = pytest.mark.django_db

MODELS: dict[str, Any] = {"run": Run, "agent": Agent, "task": Task, "step": Step}
STATES = {"run": RunStatus, "agent": NodeStatus, "task": NodeStatus, "step": StepStatus}
CASES = [
    (entity, source, target)
    for entity, states in STATES.items()
    for source in states.values
    for target in states.values
]


@pytest.mark.parametrize(("entity", "source", "target"), CASES)
def test_transition_pair(entity: str, source: str, target: str) -> None:
    rows = dict(zip(("run", "agent", "task", "step"), hierarchy({entity: source}), strict=True))
    row = rows[entity]
    model = MODELS[entity]
    events_before = RunEvent.objects.count()

    if source == target:
        result = transition(model, row.pk, target)
        assert result.changed is False
        assert RunEvent.objects.count() == events_before
    elif target in TABLES[entity][source]:
        result = transition(model, row.pk, target, actor="test", message="because")
        assert result.changed is True
        assert model.objects.get(pk=row.pk).status == target
        events = list(RunEvent.objects.filter(entity_id=str(row.pk), entity=entity))
        assert len(events) == 1
        event = events[0]
        assert (event.from_status, event.to_status, event.actor) == (source, target, "test")
        assert RunEvent.objects.count() == events_before + 1
    else:
        with pytest.raises(InvalidTransition) as raised:
            transition(model, row.pk, target)
        assert (raised.value.entity, raised.value.from_state, raised.value.to_state) == (
            entity,
            source,
            target,
        )
        assert model.objects.get(pk=row.pk).status == source
        assert RunEvent.objects.count() == events_before


def test_terminal_states_have_no_exit_but_failed_run_to_retrying() -> None:
    from runs.states import TERMINAL

    for entity, terminal in TERMINAL.items():
        for state in terminal:
            exits = TABLES[entity][state]
            if (entity, state) == ("run", "failed"):
                assert exits == {"retrying"}
            else:
                assert exits == frozenset(), (entity, state)


def test_entering_a_terminal_state_sets_completion_time_and_duration() -> None:
    run, _, _, step = hierarchy({"step": "running"})

    finished = transition(Step, step.pk, "completed").obj
    cancelled = transition(Run, run.pk, "cancelled").obj

    assert finished.completed_at is not None
    assert finished.duration_ms is not None
    assert cancelled.cancelled_at is not None
    assert cancelled.completed_at is not None
    assert cancelled.duration_ms is not None
