"""A fleet tool's progress (``Context.heartbeat``) is kept on its step's row by the lease's
renewal (orchestrator.lease_keeper.renew, at the step heartbeat's pace), what it said after
the last renewal by the step's end (the lease keeper's ``end``), and read with the
step (GET /runs/{id}/steps `progress`), as a worker tool's is read from its job
(tests/api/test_runner_tools.py); the end to end is tests/integration/test_worker_tools.py."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from orchestrator.lease_keeper import _UNSAID, PROGRESS_MAX_BYTES, _LeaseKeeper, renew
from runs.models import Step
from runs.transitions import claim_step
from tests.api import states
from tests.tenants import Tenant

pytestmark = pytest.mark.django_db


def claimed(tenant: Tenant) -> Step:
    """The first step of a running run, claimed by a fleet worker."""
    run = states.running(tenant.organization)
    step = Step.objects.filter(run=run).order_by("id").first()
    assert step is not None
    assert claim_step(step.pk, worker="test", task_id="test", lease_seconds=60) is not None
    return Step.objects.get(pk=step.pk)


def shown(tenant: Tenant, step: Step) -> Any:
    response = tenant.get(f"/api/v1/runs/{step.run_id}/steps")
    assert response.status_code == 200, response.content
    (row,) = [row for row in response.json()["results"] if row["id"] == step.pk]
    return row["progress"]


def test_a_step_shows_no_progress_before_its_tool_says_any(tenant: Tenant) -> None:
    step = claimed(tenant)

    assert renew(step.pk, step.run_id, step.attempts)

    assert shown(tenant, step) is None


def test_the_renewal_keeps_what_the_tool_last_said_and_the_step_shows_it(
    tenant: Tenant,
) -> None:
    step = claimed(tenant)

    assert renew(step.pk, step.run_id, step.attempts, progress={"sentence": 2, "of": 9})

    kept = Step.objects.get(pk=step.pk)
    assert kept.progress == {"attempt": step.attempts, "value": {"sentence": 2, "of": 9}}
    assert kept.lease_expires_at is not None
    assert shown(tenant, step) == {"sentence": 2, "of": 9}


def test_a_new_attempt_does_not_show_what_an_earlier_one_said(tenant: Tenant) -> None:
    step = claimed(tenant)
    renew(step.pk, step.run_id, step.attempts, progress={"sentence": 8})

    # The attempt failed and its retry was claimed: the step's attempts moved on.
    Step.objects.filter(pk=step.pk).update(attempts=step.attempts + 1)

    assert shown(tenant, step) is None


@pytest.mark.parametrize(
    "progress",
    [object(), float("nan"), {"text": "a\x00b"}, "x" * (PROGRESS_MAX_BYTES + 1)],
    ids=["not_json", "nan", "nul_character", "too_large"],
)
def test_progress_a_jsonb_column_cannot_keep_is_left_out_and_the_lease_renewed(
    tenant: Tenant, progress: Any, caplog: pytest.LogCaptureFixture
) -> None:
    step = claimed(tenant)
    renew(step.pk, step.run_id, step.attempts, progress={"sentence": 1})
    Step.objects.filter(pk=step.pk).update(lease_expires_at=None)

    with caplog.at_level(logging.WARNING, logger="orchestrator.lease_keeper"):
        assert renew(step.pk, step.run_id, step.attempts, progress=progress)

    kept = Step.objects.get(pk=step.pk)
    assert kept.lease_expires_at is not None
    assert shown(tenant, step) == {"sentence": 1}
    assert "progress not kept" in caplog.text


def test_the_heartbeat_thread_keeps_the_latest_progress_of_the_attempt_running_alone() -> None:
    keeper = _LeaseKeeper()
    keeper.current = (7, "run", 2)  # as begin() sets it, without starting the thread

    keeper.report_progress(7, 2, {"n": 1})
    keeper.report_progress(7, 2, {"n": 2})
    keeper.report_progress(7, 1, {"n": "an earlier attempt's"})
    keeper.report_progress(8, 2, {"n": "another step's"})
    latest = keeper.progress
    keeper.end()

    assert latest == {"n": 2}
    assert keeper.progress is _UNSAID


def test_the_end_of_a_step_keeps_what_its_tool_said_after_the_last_renewal(
    tenant: Tenant,
) -> None:
    step = claimed(tenant)
    keeper = _LeaseKeeper()
    keeper.current = (step.pk, step.run_id, step.attempts)  # as begin() sets it
    keeper._renew(keeper.current)
    keeper.report_progress(step.pk, step.attempts, {"sentence": 9, "of": 9})

    keeper.end()

    kept = Step.objects.get(pk=step.pk)
    assert kept.progress == {"attempt": step.attempts, "value": {"sentence": 9, "of": 9}}
    assert shown(tenant, step) == {"sentence": 9, "of": 9}
    assert keeper.progress is _UNSAID


def test_the_end_of_a_step_that_said_nothing_since_the_last_renewal_writes_nothing(
    tenant: Tenant,
) -> None:
    step = claimed(tenant)
    keeper = _LeaseKeeper()
    keeper.current = (step.pk, step.run_id, step.attempts)
    keeper.report_progress(step.pk, step.attempts, {"sentence": 3})
    keeper._renew(keeper.current)  # took it

    with CaptureQueriesContext(connection) as ran:
        keeper.end()

    assert ran.captured_queries == []
    assert shown(tenant, step) == {"sentence": 3}


def test_the_end_keeps_nothing_on_a_step_no_longer_running_that_attempt(tenant: Tenant) -> None:
    step = claimed(tenant)
    keeper = _LeaseKeeper()
    keeper.current = (step.pk, step.run_id, step.attempts)
    keeper.report_progress(step.pk, step.attempts, {"sentence": 4})
    # Its lease was lost and the step claimed again meanwhile: the attempt moved on.
    Step.objects.filter(pk=step.pk).update(attempts=step.attempts + 1)

    keeper.end()

    assert Step.objects.get(pk=step.pk).progress is None
