"""Doorbells with a real worker and broker: a wide fan-out and a sequence are served by a
few messages, not one per step, and every step still runs once and is charged once."""

from __future__ import annotations

from collections import Counter
from typing import Any
from uuid import UUID

import pytest
from celery.signals import before_task_publish
from django.conf import settings

from orchestrator.transport import PICK_UP_TASK
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
    pick_ups: list[str] = []

    def remember(sender: str | None = None, headers: Any = None, **kwargs: Any) -> None:
        if sender == PICK_UP_TASK:
            pick_ups.append(headers["id"])

    before_task_publish.connect(remember, weak=False)
    try:
        run = submit(one_task(6))
    finally:
        before_task_publish.disconnect(remember)

    assert wait_for(run).status == "completed"

    served = served_by(run.pk)
    assert sum(served.values()) == 6
    # The pick-up serves the sequence itself (then a doorbell, only if a burst was spent on
    # a crawling machine): the first step starts without another broker hop.
    assert len(served) < 6
    first = Step.objects.filter(run_id=run.pk).order_by("position").first()
    assert first is not None
    assert [first.celery_task_id] == pick_ups
    assert_books_balanced(run)
