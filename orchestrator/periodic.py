"""Every periodic task, declared in code and installed into django-celery-beat.

`python manage.py setup_periodic_tasks` (run by `make run` and at deploy) makes the
database match this list: it creates or updates each periodic task by name and removes
those this project once installed but no longer declares. Sweeps are idempotent and
batched, so two beats or a late tick do no harm.

Most sweeps wait for their work: beat asks PostgreSQL, every ``check_seconds``, when the
sweep next has something to do (``next_due``: the earliest moment any row it acts on is
due, or None; sooner is allowed, later is not), and sends it once that moment has come
(orchestrator/beat.py). An idle fleet therefore sends almost nothing, and a sweep runs
when its work is due, one look late at most. PostgreSQL holds every due time: a sweep
whose message is lost (expired, its worker died) is sent again at the next look while
its work is still due. Such a sweep is also sent every ``BACKSTOP_SECONDS`` whatever its
look says, which covers a look that is wrong.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from orchestrator import retention, sweeps
from runs.engine import dispatch
from runs.waits import callbacks, runners
from schedules import selectors as schedule_selectors
from webhooks import services as webhook_services

# Prefix of every periodic task this project owns; others (added by hand in the admin) are
# left alone.
PERIODIC_PREFIX = "orchestrator:"

# How often a sweep that waits for its work is sent although its look finds none.
BACKSTOP_SECONDS = 300
RETENTION_BACKSTOP_SECONDS = 3600
# The wake sweep's: a step it failed to wake is sent again by the lost-message sweep
# once it is due (late, never early), so its backstop need not be every 5 minutes.
WAKE_BACKSTOP_SECONDS = 3600


@dataclass(frozen=True)
class Periodic:
    name: str
    task: str
    # The installed interval: how often beat sends the task whatever PostgreSQL says.
    every_seconds: int
    queue: str = "sweeps"
    kwargs: dict[str, Any] = field(default_factory=dict)
    # When the sweep next has work, read by beat every `check_seconds` (module docstring).
    next_due: Callable[[], datetime | None] | None = None
    check_seconds: int = 0

    @property
    def expires_seconds(self) -> int:
        """A message that waited longer than one look (or one interval) is dropped: the
        next one does the same work."""
        return self.check_seconds or self.every_seconds


def _every(setting: str) -> int:
    from django.conf import settings

    return int(getattr(settings, setting))


def _waiting(
    name: str, task: str, next_due: Callable[[], datetime | None], check: int, **options: Any
) -> Periodic:
    """A sweep that waits for its work, looked for every ``check`` seconds."""
    return Periodic(name, task, BACKSTOP_SECONDS, next_due=next_due, check_seconds=check, **options)


def periodic_tasks() -> tuple[Periodic, ...]:
    """The periodic tasks, with intervals read from settings at install time."""
    sweep = _every("ENGINE_SWEEP_INTERVAL")
    return (
        _waiting("lease-sweep", "orchestrator.sweeps.leases", sweeps.leases_next_due, sweep),
        _waiting("timeout-sweep", "orchestrator.sweeps.timeouts", sweeps.timeouts_next_due, sweep),
        Periodic(
            name="idempotency-expiry",
            task="orchestrator.sweeps.idempotency_records",
            every_seconds=600,
        ),
        _waiting(
            "lost-message-sweep",
            "orchestrator.sweeps.lost_messages",
            sweeps.lost_messages_next_due,
            max(sweep, _every("ENGINE_LOST_MESSAGE_AFTER") // 4),
        ),
        _waiting("runner-sweep", "orchestrator.sweeps.runners", runners.next_due, sweep),
        # Steps parked beyond the step-message horizon have no message (a timer of days):
        # the wake sweep sends each, with its exact countdown, once its time comes within
        # the horizon (RATE_LIMIT_MAX_COUNTDOWN_S, 300 s: far more than a look is late).
        Periodic(
            name="wake-sweep",
            task="orchestrator.sweeps.wake",
            every_seconds=WAKE_BACKSTOP_SECONDS,
            next_due=dispatch.asleep_next_due,
            check_seconds=sweep,
        ),
        Periodic(
            name="artifact-expiry",
            task="orchestrator.sweeps.artifacts",
            every_seconds=300,
        ),
        _waiting("wait-sweep", "orchestrator.sweeps.waits", callbacks.next_due, sweep),
        Periodic(
            name="rate-grant-expiry",
            task="orchestrator.sweeps.rate_grants",
            every_seconds=600,
        ),
        # Run schedules (the `schedules` app, docs/schedules.md): each tick fires the
        # schedules that are due. Their due times come from each schedule's own anchor,
        # not from this task's last run, so a tick dropped or doubled changes nothing;
        # beat sends the tick when the earliest of them comes.
        _waiting(
            "schedule-tick",
            "orchestrator.sweeps.schedules",
            schedule_selectors.schedules_next_due,
            _every("SCHEDULES_TICK_SECONDS"),
        ),
        # Retention (docs/tenants.md): what turned older than RETENTION_DAYS is deleted
        # in small batches. Looked for every 5 minutes; its work is days old, so its
        # backstop is an hour, not BACKSTOP_SECONDS (an idle fleet sends it 12 times less).
        Periodic(
            name="retention-sweep",
            task="orchestrator.sweeps.retention",
            every_seconds=RETENTION_BACKSTOP_SECONDS,
            next_due=retention.next_due,
            check_seconds=BACKSTOP_SECONDS,
        ),
        # Run webhooks (docs/webhooks.md): claim the due deliveries and send them.
        _waiting(
            "webhook-sweep",
            "orchestrator.webhooks.sweep",
            webhook_services.deliveries_next_due,
            _every("WEBHOOK_SWEEP_INTERVAL"),
            queue="webhooks",
        ),
    )
