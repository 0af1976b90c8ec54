"""A run admitted at its start begins in the start's own transaction.

``run_start`` reserves the credits and moves the run to PENDING; when admission lets it
in at once and its plan has at most ENGINE_START_AT_ONCE_STEPS steps, the same
transaction picks it up as a worker would (``runs.engine.control.begin``): RUNNING, its
attempt materialised, its first steps claimable at commit and their doorbells rung
after it. A bigger plan, or a run that must wait for a place, is left to a worker's
pick-up. Starting a run started already answers it as it is.
"""

from __future__ import annotations

from typing import Any

import pytest

from runs import services
from runs.admission import run_admission
from runs.engine import control
from runs.engine.start import run_start
from runs.models import Run, Step
from runs.outbox import RunMessage
from runs.selectors import run_history
from runs.states import InvalidTransition
from tests import factories
from tests.runs.engine.harness import RecordingTransport
from tests.runs.engine.test_hotpath import snapshot

pytestmark = pytest.mark.django_db


@pytest.fixture
def at_once(settings: Any, transport: RecordingTransport) -> RecordingTransport:
    settings.ENGINE_START_AT_ONCE_STEPS = 200
    return transport


def start(run: Run, capture: Any) -> Run:
    with capture(execute=True):
        return run_start(run_id=run.pk, actor="api:test")


def parallel(steps: int) -> dict[str, Any]:
    spec = factories.plan(steps=steps)
    spec["agents"][0]["tasks"][0].update(mode="parallel", max_concurrent_steps=steps)
    return spec


def test_a_small_run_admitted_at_its_start_is_running_when_the_start_returns(
    at_once: RecordingTransport, django_capture_on_commit_callbacks: Any
) -> None:
    run = factories.run(steps=3)

    started = start(run, django_capture_on_commit_callbacks)

    assert started.status == "running"
    stored = Run.objects.get(pk=run.pk)
    assert stored.status == "running"
    assert stored.picked_up_at is not None
    assert stored.admitted_at is not None
    first = Step.objects.get(run=run, name="step-0")
    assert first.dispatched_at is not None
    assert first.status == "pending"  # claimable at commit
    assert [message.step_id for message in at_once.steps] == [first.pk]
    assert at_once.runs == []  # no pick-up message: nothing left for a worker to pick up
    kinds = list(run_history(run).filter(entity="run").values_list("to_status", flat=True))
    assert kinds[:2] == ["", "pending"]  # created, then started...
    assert "running" in kinds  # ...and begun by the same call


def test_a_run_begun_at_its_start_leaves_what_a_pick_up_leaves(
    at_once: RecordingTransport,
    django_capture_on_commit_callbacks: Any,
    settings: Any,
) -> None:
    spec = {
        "name": "twins",
        "agents": [
            {
                "name": "a",
                "mode": "dag",
                "tasks": [
                    {"name": "t", "mode": "parallel", "steps": [{"name": "x", "tool": "noop"}]},
                    {"name": "u", "steps": [{"name": "y", "tool": "noop"}]},
                    {"name": "v", "depends_on": ["t"], "steps": [{"name": "z", "tool": "noop"}]},
                ],
            },
            {"name": "b", "tasks": [{"name": "t", "steps": [{"name": "w", "tool": "noop"}]}]},
        ],
    }
    organization = factories.org()
    begun = services.run_create(organization=organization, plan=spec)
    picked = services.run_create(organization=organization, plan=spec)

    start(begun, django_capture_on_commit_callbacks)
    begun_sent = [message.step_id for message in at_once.steps]
    settings.ENGINE_START_AT_ONCE_STEPS = 0
    start(picked, django_capture_on_commit_callbacks)
    with django_capture_on_commit_callbacks(execute=True):
        assert control.pick_up(picked.pk, actor="api:test")

    assert snapshot(begun) == snapshot(picked)
    names = dict(Step.objects.filter(run__in=[begun, picked]).values_list("pk", "name"))
    picked_sent = [message.step_id for message in at_once.steps][len(begun_sent) :]
    assert [names[i] for i in begun_sent] == [names[i] for i in picked_sent] == ["x", "y", "w"]


def test_a_plan_over_the_limit_is_left_to_a_workers_pick_up(
    at_once: RecordingTransport, django_capture_on_commit_callbacks: Any, settings: Any
) -> None:
    settings.ENGINE_START_AT_ONCE_STEPS = 2
    run = factories.run(steps=3)

    started = start(run, django_capture_on_commit_callbacks)

    assert started.status == "pending"
    assert not Step.objects.filter(run=run).exists()  # materialised by the pick-up
    assert at_once.runs == [(RunMessage.PICK_UP, str(run.pk))]


def test_a_stored_plan_that_fails_its_checks_now_is_left_to_the_pick_up(
    at_once: RecordingTransport, django_capture_on_commit_callbacks: Any
) -> None:
    run = factories.run(steps=2)
    # As if the validator grew stricter after the run was created: the plan's shape still
    # reads (its steps and credits), a whole-plan check fails (two steps of one name).
    stale = factories.plan(steps=2)
    stale["agents"][0]["tasks"][0]["steps"][1]["name"] = "step-0"
    Run.objects.filter(pk=run.pk).update(plan=stale)

    started = start(run, django_capture_on_commit_callbacks)

    assert started.status == "pending"
    assert not Step.objects.filter(run=run).exists()  # the pick-up fails it, unbegun
    assert at_once.runs == [(RunMessage.PICK_UP, str(run.pk))]


def test_a_run_that_must_wait_for_a_place_is_left_pending(
    at_once: RecordingTransport, django_capture_on_commit_callbacks: Any
) -> None:
    organization = factories.org()
    run_admission.limits_set(organization.pk, actor="test", max_running_runs=1)
    first = factories.run(organization, steps=1)
    second = factories.run(organization, steps=1)
    assert start(first, django_capture_on_commit_callbacks).status == "running"

    started = start(second, django_capture_on_commit_callbacks)

    assert started.status == "pending"
    assert started.admitted_at is None
    assert (RunMessage.PICK_UP, str(second.pk)) in at_once.runs


def test_starting_a_started_run_again_answers_it_as_it_is(
    at_once: RecordingTransport, django_capture_on_commit_callbacks: Any
) -> None:
    run = factories.run(steps=2)
    start(run, django_capture_on_commit_callbacks)
    events = run_history(run).count()

    again = start(run, django_capture_on_commit_callbacks)

    assert again.status == "running"
    assert run_history(run).count() == events  # nothing changed
    services.run_cancel(run_id=run.pk, reason="done with it")
    with pytest.raises(InvalidTransition):  # a terminal run is not started again
        start(run, django_capture_on_commit_callbacks)


def test_a_parallel_run_begun_at_its_start_rings_its_doorbells_after_commit(
    at_once: RecordingTransport, django_capture_on_commit_callbacks: Any
) -> None:
    run = services.run_create(organization=factories.org(), plan=parallel(5))

    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        started = run_start(run_id=run.pk, actor="api:test")
        assert at_once.steps == []  # nothing leaves before the commit

    assert started.status == "running"
    assert callbacks  # published once the transaction commits
    for callback in callbacks:
        callback()
    assert len(at_once.steps) == 5
