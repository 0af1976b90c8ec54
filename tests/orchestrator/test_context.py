"""What a running step's templates read about the step itself: `${step.id|name|attempt}`."""

from __future__ import annotations

import pytest

from common.templates import render_value
from orchestrator.context import StepContext
from tests import factories

pytestmark = pytest.mark.django_db


def test_a_step_reads_its_own_id_name_and_attempt_for_an_idempotency_key() -> None:
    run, _, _, step = factories.hierarchy({"step": "running"})
    step.attempts = 3  # the claim of the third attempt sets this

    rendered = render_value(
        {
            "key": "${run.id}-${step.id}-${step.attempt}",
            "who": "${step.name}",
            "n": "${step.attempt}",
        },
        StepContext(step, run.pk),
    )

    assert rendered == {"key": f"{run.pk}-{step.pk}-3", "who": "s", "n": 3}
