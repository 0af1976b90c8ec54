"""The API's one Celery task: the beat sweep that deletes expired idempotency records.

Its name stays under `orchestrator.sweeps.*` (routed to the sweeps queue, and the name
beat's schedule and Flower know it by).
"""

from __future__ import annotations

from celery import shared_task

from api.idempotency import idempotency_records_expire
from common.task_base import RETRY_OPTIONS


@shared_task(name="orchestrator.sweeps.idempotency_records", **RETRY_OPTIONS)
def sweep_idempotency_records_task() -> int:
    return idempotency_records_expire()
