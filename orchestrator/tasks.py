"""Celery tasks of the engine. Tasks are thin: they take ids and call services."""

from __future__ import annotations

from typing import Any

from celery import shared_task


@shared_task(name="orchestrator.diagnostics.echo", ignore_result=False)
def echo_task(payload: Any) -> dict[str, Any]:
    """Return what was sent, with the worker that answered: a broker round-trip probe."""
    return {"payload": payload, "hostname": echo_task.request.hostname}
