"""Every admin page renders: the change list of each registered model, and the change
page of one of its rows, with rows of every kind present (a page that breaks on a field
or a link shows here, whichever app it belongs to)."""

from __future__ import annotations

import io
from datetime import timedelta

import pytest
from django.contrib import admin
from django.contrib.auth.models import User
from django.db.models import Model
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from artifacts import services as artifact_services
from runs import escalations
from runs.models import Replan, Step, StepFailure, StepWait
from schedules import services as schedule_services
from schedules.models import ScheduleFire
from tests import factories
from tests.api import states
from webhooks.models import WebhookAttempt

pytestmark = pytest.mark.django_db


@pytest.fixture
def operator(client: Client) -> Client:
    user = User.objects.create_superuser("ops", "ops@example.com", "a-long-password")
    client.force_login(user)
    return client


@pytest.fixture
def rows_of_every_kind() -> None:
    organization = factories.org()
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


@pytest.mark.usefixtures("rows_of_every_kind")
@pytest.mark.parametrize(
    "model", list(admin.site._registry), ids=lambda m: f"{m._meta.app_label}.{m.__name__}"
)
def test_every_admin_page_renders(operator: Client, model: type[Model]) -> None:
    info = (model._meta.app_label, model._meta.model_name)
    listing = operator.get(reverse("admin:{}_{}_changelist".format(*info)))
    assert listing.status_code == 200, listing.content[:500]
    row = model._default_manager.order_by("pk").first()
    if row is not None:
        page = operator.get(reverse("admin:{}_{}_change".format(*info), args=[row.pk]))
        assert page.status_code == 200, page.content[:500]
