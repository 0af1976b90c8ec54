"""Every (from, to) pair of every transition table, exhaustively."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from runs.models import Agent, HistoryEvent, Run, Step, Task
from runs.selectors import run_history
from runs.states import TABLES, InvalidTransition, NodeStatus, RunStatus, StepStatus
from runs.transitions import transition, transition_many
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
    events_before = HistoryEvent.objects.count()

    if source == target:
        result = transition(model, row.pk, target)
        assert result.changed is False
        assert HistoryEvent.objects.count() == events_before
    elif target in TABLES[entity][source]:
        result = transition(model, row.pk, target, actor="test", message="because")
        assert result.changed is True
        assert model.objects.get(pk=row.pk).status == target
        events = list(HistoryEvent.objects.filter(entity_id=str(row.pk), entity=entity))
        assert len(events) == 1
        event = events[0]
        assert (event.from_status, event.to_status, event.actor) == (source, target, "test")
        assert HistoryEvent.objects.count() == events_before + 1
    else:
        with pytest.raises(InvalidTransition) as raised:
            transition(model, row.pk, target)
        assert (raised.value.entity, raised.value.from_state, raised.value.to_state) == (
            entity,
            source,
            target,
        )
        assert model.objects.get(pk=row.pk).status == source
        assert HistoryEvent.objects.count() == events_before


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


def test_many_rows_move_in_one_update_each_with_its_own_start_and_duration() -> None:
    """transition_many writes every row with one UPDATE: what differs between the rows
    (when each started, how long each lasted) follows the same rules as one row's
    transition, and the rows it returns are the rows as written."""
    run, _, task, running = hierarchy({"step": "running"})
    earlier = timezone.now() - timedelta(seconds=3, microseconds=123_457)
    Step.objects.filter(pk=running.pk).update(started_at=earlier)
    pending = [
        Step.objects.create(
            run=run, task=task, attempt_number=1, name=f"p{i}", position=i + 1, tool="noop"
        )
        for i in range(3)
    ]
    done = Step.objects.create(
        run=run, task=task, attempt_number=1, name="done", position=9, tool="noop",
        status="completed",
    )  # fmt: skip
    now = timezone.now()

    moved = transition_many(
        Step,
        Step.objects.filter(run=run),
        StepStatus.CANCELLED,
        from_states=["pending", "running"],
        actor="test",
        message="stop",
        now=now,
    )

    assert sorted(step.pk for step in moved) == sorted([running.pk, *(s.pk for s in pending)])
    fields = ("status", "status_changed_at", "started_at", "completed_at", "duration_ms")
    for step in moved:
        assert tuple(getattr(step, f) for f in fields) == Step.objects.values_list(*fields).get(
            pk=step.pk
        )
    rows = {pk: rest for pk, *rest in Step.objects.values_list("pk", *fields)}
    assert rows[running.pk][2] == earlier  # kept: it had started
    assert rows[running.pk][4] == (now - earlier) // timedelta(milliseconds=1)
    for step in pending:
        assert rows[step.pk][2] is None  # never started: its duration runs from creation
        assert rows[step.pk][4] == (now - step.created_at) // timedelta(milliseconds=1)
    assert rows[done.pk][0] == "completed"  # not in a source state: left alone
    events = run_history(run).filter(entity="step", to_status="cancelled")
    assert sorted(events.values_list("entity_id", "from_status")) == sorted(
        [(str(running.pk), "running"), *((str(s.pk), "pending") for s in pending)]
    )


def test_many_rows_started_keep_their_first_start() -> None:
    run, _, task, first = hierarchy({"step": "pending"})
    earlier = timezone.now() - timedelta(seconds=5)
    Step.objects.filter(pk=first.pk).update(started_at=earlier)  # ran once, and retries
    fresh = Step.objects.create(
        run=run, task=task, attempt_number=1, name="fresh", position=1, tool="noop"
    )
    now = timezone.now()

    moved = transition_many(
        Step, Step.objects.filter(run=run), StepStatus.RUNNING, from_states=["pending"], now=now
    )

    assert dict(Step.objects.values_list("pk", "started_at")) == {first.pk: earlier, fresh.pk: now}
    assert {step.pk: step.started_at for step in moved} == {first.pk: earlier, fresh.pk: now}
