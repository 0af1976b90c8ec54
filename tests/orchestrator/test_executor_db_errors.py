"""A database error raised under a running tool is not the tool's failure.

Found by `make chaos` at a PostgreSQL restart: the tool's own query (a cancellation check,
a template's lookup) raised OperationalError and the step was failed for good with
`tool_error`. The attempt must instead be abandoned: the step stays RUNNING under its
lease, nothing is recorded or charged, and the lease sweep runs it again.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING

import pytest
from django.db import InterfaceError, OperationalError
from django.utils import timezone

from billing.models import LedgerEntry
from orchestrator import engine, executor
from orchestrator.sweeps import reclaim_expired_leases
from runs import services
from runs.models import Step
from tests import factories

if TYPE_CHECKING:
    from pytest_django.fixtures import Settings as SettingsWrapper

pytestmark = pytest.mark.django_db

# What the allow-listed callables raise, set per test.
_raised: list[Exception] = []


def raises_a_database_error() -> None:
    raise _raised[0]


@pytest.fixture
def allowed(settings: SettingsWrapper) -> str:
    path = f"{__name__}.raises_a_database_error"
    settings.PYTHON_TOOL_ALLOWLIST = [*settings.PYTHON_TOOL_ALLOWLIST, path]
    return path


def started_step(callable_path: str) -> int:
    spec = factories.plan(steps=1)
    spec["agents"][0]["tasks"][0]["steps"][0].update(
        tool="python", params={"callable": callable_path}
    )
    run = services.run_create(organization=factories.org(), spec=spec)
    services.run_start(run_id=run.pk)
    assert engine.pick_up(run.pk)
    return Step.objects.get(run=run, name="step-0").pk


@pytest.mark.parametrize(
    "error",
    [
        lambda: OperationalError("server closed the connection unexpectedly"),
        lambda: InterfaceError("connection already closed"),
    ],
    ids=["operational", "interface"],
)
def test_a_database_error_under_the_tool_abandons_the_attempt_to_the_sweep(
    allowed: str, error: Callable[[], Exception]
) -> None:
    _raised[:] = [error()]
    step_id = started_step(allowed)
    charges_before = LedgerEntry.objects.filter(type="charge").count()

    with pytest.raises((OperationalError, InterfaceError)):
        executor.execute_step(step_id, worker="worker:test")

    step = Step.objects.get(pk=step_id)
    assert step.status == "running"  # nothing recorded: not failed, not retried
    assert step.error is None
    assert step.failures == 0
    assert step.lease_expires_at is not None
    assert LedgerEntry.objects.filter(type="charge").count() == charges_before

    # Its worker stops renewing the lease; the sweep hands the step out again.
    Step.objects.filter(pk=step_id).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    assert reclaim_expired_leases() == {"reclaimed": 1, "failed": 0}
    step.refresh_from_db()
    assert step.status == "pending"
    assert step.reclaims == 1
