"""Rows of every kind the admin lists, made through the real services: what the admin's
page tests (tests/test_admin_pages.py) and its browser tests (tests/browser/) open."""

from __future__ import annotations

import io
from datetime import timedelta

from django.utils import timezone

from artifacts import services as artifact_services
from billing.models import Organization
from ratelimits.models import RateLimit
from runs.models import Replan, Step, StepFailure, StepWait
from runs.people import escalations
from schedules import services as schedule_services
from schedules.models import ScheduleFire
from tests import factories
from tests.api import states
from webhooks.models import WebhookAttempt


def rows_of_every_kind(organization_name: str | None = None) -> Organization:
    """A row of every model the admin lists, all of one organization (returned)."""
    organization = factories.org(organization_name)
    run = states.running(organization)
    states.runner_job(organization, states.runner(organization))
    step = Step.objects.filter(run=run).first()
    assert step is not None
    StepWait.objects.create(
        run=run,
        step=step,
        attempt=1,
        kind="poll",
        params={"url": "https://status.example/1"},
        expires_at=timezone.now() + timedelta(minutes=5),
    )
    artifact_services.upload(
        organization=organization, run_id=run.pk, name="a.txt", stream=io.BytesIO(b"a"), size=1
    )
    # An escalation with a delivery attempt, and a re-plan of another run.
    ticket = states.escalation(organization)
    escalations.notification_record(
        ticket=ticket, channel="webhook", attempt=1, target="https://pager.example", delivered=True
    )
    Replan.objects.create(
        run=run,
        attempt_number=1,
        number=1,
        trigger="agents_failed",
        planner="rules",
        requested_at=timezone.now(),
    )
    StepFailure.objects.create(
        run=run, attempt_number=1, step=step, step_attempt=1, code="timeout", retryable=True
    )
    # A schedule with a fire that started a run and one skipped.
    schedule = states.schedule(organization)
    schedule_services.schedule_trigger(schedule_id=schedule.pk)
    ScheduleFire.objects.create(
        schedule=schedule,
        kind="scheduled",
        due_at=timezone.now(),
        status="skipped",
        reason="missed",
        message="beat was down",
    )
    # A webhook endpoint with a delivery and an attempt (docs/webhooks.md).
    delivery = states.webhook_delivery(organization)
    WebhookAttempt.objects.create(
        delivery=delivery, number=1, status_code=500, ok=False, error="HTTP 500", duration_ms=7
    )
    # An organization's rate limit, and the operators' limit on a tool.
    RateLimit.objects.create(
        organization=organization, name="openai-tokens", limit=90_000, period_ms=60_000
    )
    RateLimit.objects.create(name="http-global", tool="http", limit=50, period_ms=1_000)
    return organization
