"""The held poll of the runner protocol (api.runners.held_poll), in process."""

from __future__ import annotations

from typing import Any

import pytest

from api import runners as runner_api
from tests.api import states
from tests.tenants import Tenant

pytestmark = pytest.mark.django_db


def test_a_poll_without_redis_still_holds_and_answers(tenant: Tenant, settings: Any) -> None:
    # Nothing listens on port 1 of the loopback: the subscription is refused at once.
    settings.CELERY_BROKER_URL = "redis://127.0.0.1:1/0"
    runner = states.runner(tenant.organization)

    result = runner_api.held_poll(tenant.organization, runner.pk, wait=0.2)

    assert result.empty


def test_a_held_poll_takes_a_job_already_waiting_at_once(tenant: Tenant) -> None:
    runner = states.runner(tenant.organization)
    job = states.runner_job(tenant.organization)

    result = runner_api.held_poll(tenant.organization, runner.pk, wait=30)

    assert result.job is not None
    assert result.job.pk == job.pk


def test_the_poll_route_answers_204_when_there_is_nothing(tenant: Tenant) -> None:
    runner = states.runner(tenant.organization)

    response = tenant.get("/api/v1/runner/jobs", {"runner_id": runner.pk, "wait": 0})

    assert response.status_code == 204


def test_the_wait_is_bounded(tenant: Tenant) -> None:
    runner = states.runner(tenant.organization)

    response = tenant.get("/api/v1/runner/jobs", {"runner_id": runner.pk, "wait": 31})

    assert response.status_code == 400
    assert response.json()["details"][0]["path"] == "wait"
