"""Every periodic task, declared in code and installed into django-celery-beat.

`python manage.py setup_periodic_tasks` (run by `make run` and at deploy) makes the
database match this list: it creates or updates each periodic task by name and removes
those this project once installed but no longer declares. Sweeps are idempotent and
batched, so two beats or a late tick do no harm.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Prefix of every periodic task this project owns; others (added by hand in the admin) are
# left alone.
PERIODIC_PREFIX = "orchestrator:"


@dataclass(frozen=True)
class Periodic:
    name: str
    task: str
    every_seconds: int
    queue: str = "sweeps"
    kwargs: dict[str, Any] = field(default_factory=dict)
    # Drop a tick that waited longer than one interval: the next one does the same work.
    expires_seconds: int | None = None


def _every(setting: str) -> int:
    from django.conf import settings

    return int(getattr(settings, setting))


def periodic_tasks() -> tuple[Periodic, ...]:
    """The periodic tasks, with intervals read from settings at install time."""
    return (
        Periodic(
            name="lease-sweep",
            task="orchestrator.sweeps.leases",
            every_seconds=_every("ENGINE_SWEEP_INTERVAL"),
        ),
        Periodic(
            name="timeout-sweep",
            task="orchestrator.sweeps.timeouts",
            every_seconds=_every("ENGINE_SWEEP_INTERVAL"),
        ),
        Periodic(
            name="idempotency-expiry",
            task="orchestrator.sweeps.idempotency_records",
            every_seconds=600,
        ),
        Periodic(
            name="lost-message-sweep",
            task="orchestrator.sweeps.lost_messages",
            every_seconds=max(
                _every("ENGINE_SWEEP_INTERVAL"), _every("ENGINE_LOST_MESSAGE_AFTER") // 4
            ),
        ),
        Periodic(
            name="runner-sweep",
            task="orchestrator.sweeps.runners",
            every_seconds=_every("ENGINE_SWEEP_INTERVAL"),
        ),
        Periodic(
            name="artifact-expiry",
            task="orchestrator.sweeps.artifacts",
            every_seconds=300,
        ),
        Periodic(
            name="wait-sweep",
            task="orchestrator.sweeps.waits",
            every_seconds=_every("ENGINE_SWEEP_INTERVAL"),
        ),
        Periodic(
            name="rate-grant-expiry",
            task="orchestrator.sweeps.rate_grants",
            every_seconds=600,
        ),
        # Run schedules (the `schedules` app, docs/schedules.md): each tick fires the
        # schedules that are due. Their due times come from each schedule's own anchor,
        # not from this task's last run, so a tick dropped or doubled changes nothing.
        Periodic(
            name="schedule-tick",
            task="orchestrator.sweeps.schedules",
            every_seconds=_every("SCHEDULES_TICK_SECONDS"),
        ),
        # Run webhooks (docs/webhooks.md): claim the due deliveries and send them.
        Periodic(
            name="webhook-sweep",
            task="orchestrator.webhooks.sweep",
            every_seconds=_every("WEBHOOK_SWEEP_INTERVAL"),
            queue="webhooks",
        ),
    )
