"""Suspending an organization, and unsuspending it (docs/tenants.md, "Suspension").

While ``Organization.suspended_at`` is set, every request with its keys answers 403
``organization_suspended`` (api/authentication.py), its schedules skip each due time
(reason ``suspended``, schedules/services.py), its webhook deliveries are held (the
sweep's claim leaves them), its runs that were running are paused and those about to
begin wait (``run_admission.admit``: queued with the reason ``SUSPENDED``). Those reads look at
the field where they already read the organization's row; this module is the one door
that writes it, for the admin's actions and ``manage.py suspend_org`` / ``unsuspend_org``.

The runs are paused by ``runs.services.run_pause`` with the actor ``suspension``, so that
the run's own events say who paused it: unsuspending resumes the paused runs whose last
pause was the suspension's, and leaves alone those a person paused (before the
suspension, or after it through the admin). Each run is paused or resumed in its own
transaction after the organization's row is written (never under one lock for all of
them), so a crash half way leaves a state that running the same command again completes.

A run caught ``resuming`` (a resume in flight: PAUSED -> RESUMING is done, the worker's
RESUMING -> RUNNING is not) cannot be paused from there; the worker's resume
(``runs.engine.control.resume``) reads the organization under the run's lock and pauses
it again at once, with the same actor. The race is closed by the order of the two
writes: the organization's row is committed before the runs are listed, and each listed
run is locked before it is looked at, so either the resume ran first (the run is
``running`` when its lock is had, and is paused here) or it runs after (and reads the
suspension). The other doors a suspension closes read the same row: a callback's post
(``runs.waits.callbacks``, 409 ``organization_suspended``) and a runner's held poll, which the
suspension wakes so that it ends at once (``runs.waits.runners.poll``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from uuid import UUID

from django.db import transaction
from django.db.models import OuterRef, QuerySet, Subquery
from django.utils import timezone

from billing.models import Organization
from runs import services
from runs.admission import run_admission
from runs.models import HistoryEvent, Run
from runs.outbox import wake_runners
from runs.states import InvalidTransition, RunStatus

logger = logging.getLogger(__name__)

SUSPENSION_ACTOR = run_admission.SUSPENSION_ACTOR
REASON_MAX_LENGTH = 500


@dataclass
class Suspension:
    """What a suspend or unsuspend did: the organization as it stands, and the runs it
    paused (or resumed)."""

    organization: Organization
    runs: list[UUID] = field(default_factory=list)


def organization_suspend(
    *, organization: Organization, reason: str = "", actor: str = "system"
) -> Suspension:
    """Suspend the organization (its ``suspended_at`` kept if it is suspended already,
    its reason replaced when one is given), then pause its running runs."""
    reason = reason.strip()[:REASON_MAX_LENGTH]
    with transaction.atomic():
        locked = Organization.objects.select_for_update(no_key=True).get(pk=organization.pk)
        if locked.suspended_at is None:
            locked.suspended_at = timezone.now()
        if reason:
            locked.suspended_reason = reason
        locked.save(update_fields=["suspended_at", "suspended_reason"])
    logger.info("organization %s suspended by %s: %s", locked.pk, actor, reason)
    # Its runners' held polls end now, not at their next look.
    wake_runners(str(locked.pk), [])
    done = Suspension(locked)
    moving = Run.objects.filter(
        organization=locked, status__in=(RunStatus.RUNNING, RunStatus.RESUMING)
    )
    for run_id in moving.order_by("created_at").values_list("pk", flat=True):
        if _paused(run_id):
            done.runs.append(run_id)
    return done


@transaction.atomic
def _paused(run_id: UUID) -> bool:
    """Pause the run if it is running. One still resuming is left to its resume, which
    pauses it (the suspension is committed before this lock is taken: module
    docstring)."""
    run = services.lock_run(run_id, light=True)
    if run.status != RunStatus.RUNNING:
        return False  # moved on since it was listed (ended, waits for an approval)
    paused = services.run_pause(run_id=run_id, actor=SUSPENSION_ACTOR)
    return paused.status == RunStatus.PAUSED


def organization_unsuspend(*, organization: Organization, actor: str = "system") -> Suspension:
    """Lift the suspension, then resume the runs it paused, and only those (on an
    organization not suspended: the runs a suspension paused and an earlier unsuspend
    did not get to resume, if it stopped half way)."""
    with transaction.atomic():
        locked = Organization.objects.select_for_update(no_key=True).get(pk=organization.pk)
        if locked.suspended_at is not None:
            locked.suspended_at = None
            locked.suspended_reason = ""
            locked.save(update_fields=["suspended_at", "suspended_reason"])
            logger.info("organization %s unsuspended by %s", locked.pk, actor)
    done = Suspension(locked)
    for run_id in paused_by_suspension(locked).values_list("pk", flat=True):
        try:
            services.run_resume(run_id=run_id, actor=SUSPENSION_ACTOR)
        except InvalidTransition:
            continue  # cancelled or failed meanwhile
        done.runs.append(run_id)
    # The runs that were to begin while it lasted waited (``run_admission.admit``): their
    # turn now, as places allow.
    run_admission.admit_waiting(locked.pk)
    return done


def paused_by_suspension(organization: Organization) -> QuerySet[Run]:
    """The organization's paused runs whose last pause was a suspension's, oldest first
    (read from each run's events, newest first by the index on (run, id))."""
    last_pause = (
        HistoryEvent.objects.filter(run=OuterRef("pk"), entity="run", to_status=RunStatus.PAUSED)
        .order_by("-id")
        .values("actor")[:1]
    )
    return (
        Run.objects.filter(organization=organization, status=RunStatus.PAUSED)
        .annotate(paused_by=Subquery(last_pause))
        .filter(paused_by=SUSPENSION_ACTOR)
        .order_by("created_at")
    )
