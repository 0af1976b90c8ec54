"""Steps running when a pause comes finish and keep their results, even when they are the
last of their task: found by `make chaos` (the recording failed with `task cannot go
from paused to completed`, the step was reclaimed and its tool ran again).

In-process: the engine's recording path is fed outcomes directly, no worker.
"""

from __future__ import annotations

from typing import Any

import pytest

from common.tools.base import ToolError
from orchestrator import executor
from runs import services
from runs.engine import control
from runs.engine.outcomes import Outcome, record
from runs.engine.start import run_start
from runs.models import Agent, Run, Step, Task
from tests import factories

pytestmark = pytest.mark.django_db


def running_single_step_run(**plan: Any) -> tuple[Run, Step]:
    spec = factories.plan(steps=1, **plan)
    run = services.run_create(organization=factories.org(), plan=spec)
    run_start(run_id=run.pk)
    assert control.pick_up(run.pk)
    step = Step.objects.get(run=run, name="step-0")
    claimed = executor.claim(step.pk, "worker:test", "task-1")
    assert claimed is not None
    return run, claimed


def status(model: Any, **filters: Any) -> str:
    return str(model.objects.values_list("status", flat=True).get(**filters))


def test_the_last_step_finishing_during_a_pause_completes_its_task_and_agent() -> None:
    run, step = running_single_step_run()
    services.run_pause(run_id=run.pk)

    record(step.pk, run.pk, step.attempts, Outcome(output={"ok": 1}))

    assert status(Step, pk=step.pk) == "completed"
    assert status(Task, run=run) == "completed"
    assert status(Agent, run=run) == "completed"
    assert status(Run, pk=run.pk) == "paused"  # the run itself waits for resume

    services.run_resume(run_id=run.pk)
    control.resume(run.pk)

    assert status(Run, pk=run.pk) == "completed"


def test_a_step_failing_for_good_during_a_pause_fails_a_fail_fast_run_at_its_resume() -> None:
    run, step = running_single_step_run()
    services.run_pause(run_id=run.pk)

    outcome = Outcome(error=ToolError("invalid_input", "bad", False))
    record(step.pk, run.pk, step.attempts, outcome)

    assert status(Step, pk=step.pk) == "failed"
    assert status(Run, pk=run.pk) == "paused"  # the pause holds the run's end
    services.run_resume(run_id=run.pk)
    assert control.resume(run.pk)
    current = Run.objects.get(pk=run.pk)
    assert current.status == "failed"
    assert current.last_error["code"] == "invalid_input"
