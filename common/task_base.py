"""The base every Celery task of ours is declared with (``EngineTask``, ``RETRY_OPTIONS``):
the worker's (``orchestrator.tasks``) and the API's sweep (``api.tasks``) alike, so it
sits in the shared leaf rather than in either interface."""

from __future__ import annotations

from typing import Any

from celery import Task
from celery.backends.base import BaseBackend, DisabledBackend
from django.db import DatabaseError, InterfaceError, OperationalError
from kombu.exceptions import OperationalError as BrokerError

from common import logcontext


class EngineTask(Task):  # type: ignore[type-arg]
    """A task whose outcome lives in PostgreSQL only: it never touches the result backend.

    Asking for no result (``ignore_result``) is not enough: Celery's worker still writes
    one on some paths (cancelling running tasks after a broker connection loss stores a
    "retry" state), and with Redis down at that moment the write raised in the worker's
    main process and killed it (found by make chaos). A disabled backend stores nothing.
    """

    _disabled_backend: BaseBackend | None = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # A run's task logs with its run id (common.logcontext); a step's, its step's.
        with logcontext.bound(run_id=_run_of(self.name, args, kwargs)):
            try:
                return super().__call__(*args, **kwargs)
            except DatabaseError as exc:
                ending = exit_behind(exc)
                if ending is not None:
                    raise ending from None
                raise

    # Read-only on purpose: nothing may put a real backend back.
    @property  # type: ignore[misc]
    def backend(self) -> BaseBackend:  # type: ignore[override]
        if self._disabled_backend is None:
            type(self)._disabled_backend = DisabledBackend(self.app)
        assert self._disabled_backend is not None
        return self._disabled_backend


# Tasks whose first argument is a run's id.
_RUN_TASKS = ("orchestrator.runs.", "orchestrator.steps.doorbell")


def _run_of(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if "run_id" in kwargs:
        return kwargs["run_id"]
    return args[0] if args and name.startswith(_RUN_TASKS) else None


def exit_behind(exc: BaseException) -> SystemExit | None:
    """The SystemExit a database error replaced, if any.

    A revoke with terminate (a cancelled run's running steps, ``runs.outbox``) sends
    SIGTERM to the pool child, and billiard's handler raises SystemExit wherever the task
    is. Inside COMMIT, Django's ``atomic`` then tries to restore autocommit on the
    interrupted connection, and psycopg's "can't change 'autocommit' now" replaced the
    exit: the task "raised unexpected" and the child lived on (found by make load, with
    the logs it now keeps). Raising the exit again ends the child as the revoke meant;
    the transaction never committed, and what it was doing is the sweeps' (leases).
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, SystemExit):
            return current
        seen.add(id(current))
        current = current.__context__
    return None


TRANSIENT = (OperationalError, InterfaceError, BrokerError)
RETRY_OPTIONS: dict[str, Any] = {
    "base": EngineTask,
    "autoretry_for": TRANSIENT,
    "retry_backoff": True,
    "retry_backoff_max": 60,
    "retry_jitter": True,
    "max_retries": 8,
}
