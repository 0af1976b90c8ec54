"""What tools see of artifacts: ``ToolContext.save_bytes`` / ``save_file`` (through the
executor's ``StepArtifacts``), the output listing what a step saved, and refusals as
step error codes."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest

from artifacts.models import Artifact
from common.tools.base import ToolContext, ToolError
from orchestrator.executor import StepArtifacts
from runs.engine.outcomes import Outcome
from runs.models import Step
from tests import factories
from tests.api import states

pytestmark = pytest.mark.django_db


def context_of(step: Step, saved: StepArtifacts) -> ToolContext:
    ctx = ToolContext(step_id=step.pk, run_id=str(step.run_id), attempt=1, timeout_s=30)
    ctx.save_artifact = saved.save
    return ctx


def a_step() -> Step:
    run = states.running(factories.org())
    return Step.objects.filter(run=run).first()  # type: ignore[return-value]


def test_a_tool_saves_bytes_and_files_and_its_output_lists_them(
    backend: str, tmp_path: Path
) -> None:
    step = a_step()
    saved = StepArtifacts(step)
    ctx = context_of(step, saved)
    source = tmp_path / "notes.txt"
    source.write_bytes(b"some notes")

    first = ctx.save_bytes("data.json", b'{"a": 1}', "application/json")
    second = ctx.save_file("notes.txt", str(source))

    rows = {a.name: a for a in Artifact.objects.filter(run_id=step.run_id)}
    assert first["id"] == str(rows["data.json"].pk)
    assert (rows["notes.txt"].size, rows["notes.txt"].step_id) == (10, step.pk)
    listed = saved.listed_in(Outcome(output={"done": True})).output
    assert listed == {"done": True, "artifacts": [first["id"], second["id"]]}
    assert saved.listed_in(Outcome(output=[1])).output == {
        "result": [1],
        "artifacts": [first["id"], second["id"]],
    }


@pytest.mark.parametrize(
    ("setting", "code", "retryable"),
    [
        (None, "invalid_input", False),  # the name is taken
        ("ARTIFACT_MAX_FILE_BYTES", "quota_exceeded", False),
        ("QUOTA_ARTIFACTS", "quota_exceeded", False),  # the organization's, all runs
        ("QUOTA_ARTIFACT_BYTES", "quota_exceeded", False),
        ("ARTIFACT_MAX_IN_FLIGHT", "rate_limited", True),
    ],
)
def test_a_refused_artifact_is_a_step_error(
    backend: str, settings: Any, setting: str | None, code: str, retryable: bool
) -> None:
    step = a_step()
    ctx = context_of(step, StepArtifacts(step))
    ctx.save_bytes("taken", b"x")
    if setting == "ARTIFACT_MAX_FILE_BYTES":
        settings.ARTIFACT_MAX_FILE_BYTES = 1
    elif setting == "QUOTA_ARTIFACTS":
        settings.QUOTA_ARTIFACTS = 1
    elif setting == "QUOTA_ARTIFACT_BYTES":
        settings.QUOTA_ARTIFACT_BYTES = 2
    elif setting == "ARTIFACT_MAX_IN_FLIGHT":
        Artifact.objects.filter(run_id=step.run_id).update(status="uploading")
        settings.ARTIFACT_MAX_IN_FLIGHT = 1

    with pytest.raises(ToolError) as refused:
        ctx.save_artifact("taken" if setting is None else "other", io.BytesIO(b"yy"), 2, "")
    assert (refused.value.code, refused.value.retryable) == (code, retryable)
