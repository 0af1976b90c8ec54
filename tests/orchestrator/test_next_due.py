"""Beat's looks (orchestrator/periodic.py): each sweep's ``next_due`` says when the sweep
next has work, never later than the sweep itself finds it. Each test builds the work,
then checks the look against the sweep a moment before and after the time it names.
(The runners' and the waits' looks are checked beside their sweeps' own tests.)"""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from django.utils import timezone

from orchestrator import sweeps
from orchestrator.periodic import periodic_tasks
from runs import services
from runs.engine import control
from runs.engine.start import run_start
from runs.models import Agent, Run, Step
from runs.services import run_cancel
from schedules import selectors as schedule_selectors
from schedules import services as schedule_services
from tests import factories
from tests.schedules.conftest import scheduled_plan
from tests.webhooks.support import endpoint
from webhooks import services as webhook_services
from webhooks.models import WebhookDelivery

pytestmark = pytest.mark.django_db

SECOND = timedelta(seconds=1)
NOTHING_LOST = {"steps": 0, "runs": 0, "replans": 0, "notices": 0, "admissions": 0}


def running(**options: object) -> Run:
    run = run_start(run_id=factories.run(**options).pk)  # type: ignore[arg-type]
    control.pick_up(run.pk)  # in this process; dispatch is off, so nothing is sent
    return Run.objects.get(pk=run.pk)


def claim() -> list[webhook_services.Claim]:
    return webhook_services.deliveries_claim(limit=10, per_endpoint=1, lease_seconds=60)


def test_nothing_is_due_on_an_idle_fleet() -> None:
    factories.org()

    looks = {p.name: p.next_due() for p in periodic_tasks() if p.next_due is not None}

    assert looks == dict.fromkeys(looks, None)
    assert len(looks) == 9


def test_a_lease_is_looked_for_when_it_expires() -> None:
    run = running()
    step = Step.objects.filter(run=run).first()
    assert step is not None
    expiry = timezone.now() + 30 * SECOND
    Step.objects.filter(pk=step.pk).update(status="running", lease_expires_at=expiry)

    assert sweeps.leases_next_due() == expiry
    assert sweeps.reclaim_expired_leases() == {"reclaimed": 0, "failed": 0}
    Step.objects.filter(pk=step.pk).update(lease_expires_at=timezone.now() - SECOND)
    assert sweeps.leases_next_due() <= timezone.now()
    assert sweeps.reclaim_expired_leases() == {"reclaimed": 1, "failed": 0}
    assert sweeps.leases_next_due() is None


def test_a_run_timeout_is_looked_for_at_its_deadline() -> None:
    run = running(timeouts={"run": "30m"})  # before its task's (1 h by default)
    assert run.picked_up_at is not None
    deadline = run.picked_up_at + timedelta(minutes=30)

    assert sweeps.timeouts_next_due() == deadline
    assert sweeps.sweep_timeouts(now=deadline - SECOND) == {}
    assert sweeps.sweep_timeouts(now=deadline + SECOND) == {"run_timeout": 1}


def test_an_agent_timeout_is_looked_for_while_its_run_can_time_it_out() -> None:
    run = running(timeouts={"agent": "10m"})
    agent = Agent.objects.get(run=run)
    assert agent.started_at is not None
    deadline = agent.started_at + timedelta(minutes=10)

    assert sweeps.timeouts_next_due() == deadline
    # Paused, the run times out no agent (the sweep skips it): its own deadline is next.
    services.run_pause(run_id=run.pk)
    paused = Run.objects.get(pk=run.pk).status_changed_at + timedelta(days=7)
    assert sweeps.timeouts_next_due() == paused
    assert sweeps.sweep_timeouts(now=deadline + SECOND) == {}


def test_a_lost_step_message_is_looked_for_once_it_is_overdue(settings: object) -> None:
    run = running(steps=2)
    step = Step.objects.get(run=run, dispatched_at__isnull=False)
    assert step.dispatched_at is not None
    due = step.dispatched_at + timedelta(seconds=120)

    assert sweeps.lost_messages_next_due() == due
    assert sweeps.redispatch_lost(now=due - SECOND) == NOTHING_LOST
    assert sweeps.redispatch_lost(now=due + SECOND)["steps"] == 1


def test_a_lost_pick_up_is_looked_for_again_a_threshold_after_it_was_sent_again() -> None:
    run = run_start(run_id=factories.run().pk)
    due = run.status_changed_at + timedelta(seconds=120)

    assert sweeps.lost_messages_next_due() == due
    assert sweeps.redispatch_lost(now=due + SECOND)["runs"] == 1
    assert sweeps.lost_messages_next_due() == due + SECOND + timedelta(seconds=120)


def test_a_delivery_is_looked_for_at_its_attempt_and_when_its_lease_ends() -> None:
    hook = endpoint(factories.org())
    run_cancel(run_id=factories.run(hook.organization).pk, reason="announce it")
    delivery = WebhookDelivery.objects.get()

    assert webhook_services.deliveries_next_due() == delivery.next_attempt_at
    claimed = claim()
    assert len(claimed) == 1
    lease = WebhookDelivery.objects.get().lease_until
    assert webhook_services.deliveries_next_due() == lease
    assert claim() == []  # held by its lease until then


def test_a_run_s_later_delivery_waits_for_its_earlier_one_s_retry() -> None:
    hook = endpoint(factories.org())
    run = factories.run(hook.organization)
    run_cancel(run_id=run.pk, reason="announce it")
    first = WebhookDelivery.objects.get()
    retry = timezone.now() + timedelta(minutes=5)
    WebhookDelivery.objects.filter(pk=first.pk).update(next_attempt_at=retry)
    WebhookDelivery.objects.create(
        endpoint=hook,
        run=run,
        event_type="run.completed",
        payload={},
        next_attempt_at=timezone.now(),
        created_at=timezone.now(),
    )

    # The later one is due now, but the sweep sends nothing of the run before the first.
    assert webhook_services.deliveries_next_due() == retry
    assert claim() == []


def test_a_disabled_endpoint_s_deliveries_are_not_looked_for_but_its_test_ping_is() -> None:
    hook = endpoint(factories.org())
    run_cancel(run_id=factories.run(hook.organization).pk, reason="announce it")
    webhook_services.endpoint_update(endpoint_id=hook.pk, enabled=False)

    assert webhook_services.deliveries_next_due() is None
    assert claim() == []
    ping = webhook_services.endpoint_test(endpoint_id=hook.pk)
    assert webhook_services.deliveries_next_due() == ping.next_attempt_at
    assert [c.delivery_id for c in claim()] == [ping.pk]


def test_a_schedule_is_looked_for_at_its_next_due_time_unless_paused() -> None:
    created = timezone.now()
    schedule = schedule_services.schedule_create(
        organization=factories.org(credits=100),
        name="hourly",
        plan=scheduled_plan(),
        interval="1h",
        now=created,
    )
    due: datetime = created + timedelta(hours=1)

    assert schedule_selectors.schedules_next_due() == due
    assert schedule_services.schedules_fire_due(now=due - SECOND) == {}
    schedule_services.schedule_pause(schedule_id=schedule.pk)
    assert schedule_selectors.schedules_next_due() is None
