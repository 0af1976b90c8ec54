"""Database trouble under a running tool: not the tool's failure, and never lost; and what
a tool returns that the database could not store.

A database error raised under a running tool is not the tool's failure.

Found by `make chaos` at a PostgreSQL restart: the tool's own query (a cancellation check,
a template's lookup) raised OperationalError and the step was failed for good with
`tool_error`. The attempt must instead be abandoned: the step stays RUNNING under its
lease, nothing is recorded or charged, and the lease sweep runs it again.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from datetime import timedelta
from types import FrameType
from typing import TYPE_CHECKING

import pytest
from celery.exceptions import SoftTimeLimitExceeded
from celery.signals import task_prerun
from django.db import InterfaceError, OperationalError, connection
from django.utils import timezone
from psycopg.pq import TransactionStatus

from billing.models import Reservation
from common.tools.base import ToolError
from orchestrator import executor
from orchestrator.sweeps import reclaim_expired_leases
from runs import services
from runs.engine import control
from runs.engine.start import run_start
from runs.models import Step
from tests import factories
from tests.support import wait_until

if TYPE_CHECKING:
    from pytest_django.fixtures import Settings as SettingsWrapper

# What the allow-listed callables raise, set per test.
_raised: list[Exception] = []


def raises_a_database_error() -> None:
    raise _raised[0]


def queries_for_long() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_sleep(30)")


def allow(settings: SettingsWrapper, name: str) -> str:
    path = f"{__name__}.{name}"
    settings.PYTHON_TOOL_ALLOWLIST = [*settings.PYTHON_TOOL_ALLOWLIST, path]
    return path


@pytest.fixture
def allowed(settings: SettingsWrapper) -> str:
    return allow(settings, "raises_a_database_error")


def started_step(callable_path: str) -> int:
    spec = factories.plan(steps=1)
    spec["agents"][0]["tasks"][0]["steps"][0].update(
        tool="python", params={"callable": callable_path}
    )
    run = services.run_create(organization=factories.org(), plan=spec)
    run_start(run_id=run.pk)
    assert control.pick_up(run.pk)
    return Step.objects.get(run=run, name="step-0").pk


@pytest.mark.django_db
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
    reservation = Reservation.objects.get(run_id=Step.objects.get(pk=step_id).run_id)

    with pytest.raises((OperationalError, InterfaceError)):
        executor.execute_step(step_id, worker="worker:test")

    step = Step.objects.get(pk=step_id)
    assert step.status == "running"  # nothing recorded: not failed, not retried
    assert step.error is None
    assert step.failures == 0
    assert step.lease_expires_at is not None
    assert Reservation.objects.get(pk=reservation.pk).charged == reservation.charged

    # Its worker stops renewing the lease; the sweep hands the step out again.
    Step.objects.filter(pk=step_id).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    assert reclaim_expired_leases() == {"reclaimed": 1, "failed": 0}
    step.refresh_from_db()
    assert step.status == "pending"
    assert step.reclaims == 1


@pytest.mark.django_db(transaction=True)  # the tool's query must run outside any transaction
def test_a_soft_time_limit_inside_a_query_still_records_the_timeout(
    settings: SettingsWrapper,
) -> None:
    # Celery's soft time limit is a signal raising SoftTimeLimitExceeded wherever the tool
    # is; here, in the middle of a query. psycopg leaves that connection mid-command, and
    # the recording on it failed with "can't change 'autocommit' now" (found by make load).
    step_id = started_step(allow(settings, "queries_for_long"))

    def soft_limit(signum: int, frame: FrameType | None) -> None:
        raise SoftTimeLimitExceeded()

    previous = signal.signal(signal.SIGALRM, soft_limit)
    signal.setitimer(signal.ITIMER_REAL, 0.5)  # fires while pg_sleep(30) runs
    try:
        result = executor.execute_step(step_id, worker="worker:test")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)

    assert result == "failed"  # recorded: a retryable timeout, the retry scheduled
    step = Step.objects.get(pk=step_id)
    assert step.error["code"] == "timeout"
    assert (step.status, step.failures) == ("pending", 1)
    wait_until(lambda: not sleeping_queries(), timeout=10, what="the query to be cancelled")


def sleeping_queries() -> int:
    """Sessions of this test's database still running the tool's interrupted query: a
    session's last query stays in pg_stat_activity once it is idle, and the other test
    processes' databases are theirs."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND state = 'active' AND query LIKE 'SELECT pg_sleep(30)%'"
        )
        row = cursor.fetchone()
    return int(row[0])


# --------------------------------------------------------------------------- unstorable text
def returns_a_nul_character() -> dict[str, object]:
    return {"body": ["fine", "binary\x00junk"]}


def raises_with_a_nul_character() -> None:
    raise ToolError("upstream_error", "the server said: \x00\ud800", retryable=False)


@pytest.mark.django_db
def test_an_output_postgresql_cannot_store_fails_the_step_as_invalid_output(
    settings: SettingsWrapper,
) -> None:
    step_id = started_step(allow(settings, "returns_a_nul_character"))

    assert executor.execute_step(step_id, worker="worker:test") == "failed"

    step = Step.objects.get(pk=step_id)
    assert step.status == "failed"
    assert step.error is not None
    assert step.error["code"] == "invalid_output"
    assert step.error["message"] == "output cannot be stored: $.body[1]: contains a NUL character"
    assert step.output is None


@pytest.mark.django_db
def test_an_error_message_postgresql_cannot_store_is_recorded_readable(
    settings: SettingsWrapper,
) -> None:
    step_id = started_step(allow(settings, "raises_with_a_nul_character"))

    assert executor.execute_step(step_id, worker="worker:test") == "failed"

    step = Step.objects.get(pk=step_id)
    assert step.error is not None
    assert (step.status, step.error["code"]) == ("failed", "upstream_error")
    assert step.error["message"] == "the server said: \ufffd\ufffd"


@pytest.mark.django_db(transaction=True)
def test_a_task_starts_on_a_usable_connection_after_one_interrupted_in_a_query() -> None:
    # A query sent and never read: the connection a task interrupted mid-query leaves.
    connection.ensure_connection()
    connection.connection.pgconn.send_query(b"SELECT pg_sleep(30)")
    assert connection.connection.info.transaction_status == TransactionStatus.ACTIVE

    task_prerun.send(sender=None, task_id="next", task=None, args=(), kwargs={})

    with connection.cursor() as cursor:  # a fresh connection: the next query just works
        cursor.execute("SELECT 1")
        assert cursor.fetchone() == (1,)
    wait_until(lambda: not sleeping_queries(), timeout=10, what="the query to be cancelled")
