"""A request reads its plan once: the run's create, its start, a schedule's trigger. The
plan's model (``Plan.model_validate``) and its whole-plan checks (``check_plan``) are
counted while the request runs; the create's reading is handed on to the start."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from unittest import mock

import pytest
from django.conf import LazySettings

from runs import services
from runs.plan import Plan
from runs.plan.checks import check_plan
from tests import factories
from tests.api import states
from tests.schedules.conftest import make_schedule
from tests.tenants import Tenant

pytestmark = pytest.mark.django_db


@dataclass
class Reads:
    model: mock.Mock
    checks: mock.Mock

    @property
    def counts(self) -> tuple[int, int]:
        return self.model.call_count, self.checks.call_count


@contextmanager
def plan_reads() -> Iterator[Reads]:
    """Counts the plan's model read from JSON and its whole-plan checks: ``parse_plan``'s,
    and a start's own (``runs.engine.start``, past a model it read already)."""
    checks = mock.Mock(wraps=check_plan)
    with (
        mock.patch.object(Plan, "model_validate", wraps=Plan.model_validate) as model,
        mock.patch("runs.plan.check_plan", checks),
        mock.patch("runs.engine.start.check_plan", checks),
    ):
        yield Reads(model, checks)


# At once: a small plan begun in the start's own transaction; pending: left to a pick-up.
START_PATHS = pytest.mark.parametrize("at_once_steps", [50, 0], ids=["at_once", "pending"])


@START_PATHS
def test_creating_and_starting_a_run_reads_its_plan_once(
    tenant: Tenant, settings: LazySettings, at_once_steps: int
) -> None:
    settings.ENGINE_START_AT_ONCE_STEPS = at_once_steps

    with plan_reads() as reads:
        response = tenant.post("/api/v1/runs", {"plan": factories.plan(steps=2), "start": True})

    assert response.status_code == 201, response.json()
    assert response.json()["status"] == ("running" if at_once_steps else "pending")
    assert reads.counts == (1, 1)


@START_PATHS
def test_starting_a_created_run_reads_its_plan_once(
    tenant: Tenant, settings: LazySettings, at_once_steps: int
) -> None:
    settings.ENGINE_START_AT_ONCE_STEPS = at_once_steps
    run = services.run_create(organization=tenant.organization, plan=factories.plan(steps=2))

    with plan_reads() as reads:
        response = tenant.post(f"/api/v1/runs/{run.pk}/start")

    assert response.status_code == 200, response.json()
    assert response.json()["status"] == ("running" if at_once_steps else "pending")
    # The whole-plan checks, passed at creation, are made again only before the run is
    # begun (as a pick-up makes them): a pending start reads the model alone.
    assert reads.counts == (1, 1 if at_once_steps else 0)


def test_triggering_a_schedule_reads_its_plan_once(tenant: Tenant) -> None:
    schedule = make_schedule(tenant.organization)

    with plan_reads() as reads:
        response = tenant.post(f"/api/v1/schedules/{schedule.pk}/trigger")

    assert response.status_code == 200, response.json()
    assert response.json()["status"] == "fired"
    assert reads.counts == (1, 1)


def test_a_created_run_not_started_reads_its_plan_once(tenant: Tenant) -> None:
    with plan_reads() as reads:
        response = tenant.post("/api/v1/runs", {"plan": factories.plan(steps=2)})

    assert response.status_code == 201, response.json()
    assert reads.counts == (1, 1)


@START_PATHS
def test_forking_and_starting_a_run_reads_the_forks_plan_once(
    tenant: Tenant, settings: LazySettings, at_once_steps: int
) -> None:
    settings.ENGINE_START_AT_ONCE_STEPS = at_once_steps
    source = states.failed(tenant.organization)

    with plan_reads() as reads:
        response = tenant.post(
            f"/api/v1/runs/{source.pk}/fork", {"from": "agent-0.task-0.step-0", "start": True}
        )

    assert response.status_code == 201, response.json()
    assert response.json()["status"] == ("running" if at_once_steps else "pending")
    # The source's plan, read to compare its steps with the fork's, and the fork's own.
    assert reads.counts == (2, 2)
