"""A revoke's SIGTERM that lands inside COMMIT ends the pool child as it should, instead
of surfacing as psycopg's "can't change 'autocommit' now" (common.task_base)."""

from __future__ import annotations

import pytest
from django.db import DatabaseError, ProgrammingError

from common.task_base import EngineTask, exit_behind
from config.celery import app


def interrupted_commit() -> None:
    try:
        raise SystemExit(-241)  # billiard's _shutdown_cleanup, inside COMMIT
    except SystemExit:
        raise ProgrammingError("can't change 'autocommit' now") from None


class Interrupted(EngineTask):
    name = "tests.interrupted"

    def run(self) -> None:
        # `from None` hides the cause, not the context: as Django's atomic leaves it.
        try:
            raise SystemExit(-241)
        except SystemExit:
            raise ProgrammingError("can't change 'autocommit' now")  # noqa: B904


class Broken(EngineTask):
    name = "tests.broken"

    def run(self) -> None:
        raise ProgrammingError("a real programming error")


def test_the_exit_behind_a_database_error_is_found() -> None:
    with pytest.raises(ProgrammingError) as raised:
        interrupted_commit()
    found = exit_behind(raised.value)
    assert isinstance(found, SystemExit)
    assert found.code == -241
    assert exit_behind(DatabaseError("plain")) is None


def test_an_engine_task_ends_with_the_exit_not_the_error_it_caused() -> None:
    task = app.register_task(Interrupted())
    with pytest.raises(SystemExit) as ended:
        task()
    assert ended.value.code == -241
    broken = app.register_task(Broken())
    with pytest.raises(ProgrammingError):
        broken()
