"""Doorbells with a real worker and broker: a wide fan-out and a sequence are served by a
few messages, not one per step, and every step still runs once and is charged once."""

from __future__ import annotations

from collections import Counter
from uuid import UUID

import pytest
from django.conf import settings

from runs.models import Step
from tests.factories import step
from tests.integration.engine_support import assert_books_balanced, submit, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def one_task(count: int, **task: object) -> dict[str, object]:
    steps = [step(f"s{i}") for i in range(count)]
    return {
        "name": "bells",
        "agents": [{"name": "a", "tasks": [{"name": "t", "steps": steps, **task}]}],
    }


def served_by(run_id: UUID) -> Counter[str]:
    """Steps per worker task (a doorbell's id, or a step message's)."""
    return Counter(Step.objects.filter(run_id=run_id).values_list("celery_task_id", flat=True))


def test_a_wide_fan_out_is_served_by_a_few_doorbells(celery_worker: str) -> None:
    run = submit(one_task(40, mode="parallel", max_concurrent_steps=40))

    assert wait_for(run).status == "completed"

    served = served_by(run.pk)
    assert sum(served.values()) == 40
    # At most ENGINE_DOORBELLS rang at pick-up (and one more per spent burst): far fewer
    # worker tasks than steps, each serving several.
    assert len(served) < 40
    assert max(served.values()) >= 40 // (settings.ENGINE_DOORBELLS * 2)
    assert_books_balanced(run)


def test_a_sequence_goes_from_step_to_step_without_a_message_each(celery_worker: str) -> None:
    run = submit(one_task(6))

    assert wait_for(run).status == "completed"

    served = served_by(run.pk)
    assert sum(served.values()) == 6
    assert len(served) < 6  # one doorbell, unless a burst was spent on a crawling machine
    assert_books_balanced(run)
