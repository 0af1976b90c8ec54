"""Held runner polls over real HTTP (pytest-django's live server, the real PostgreSQL and
Redis): at most the organization's quota `runner_polls` held at once (`429
too_many_polls`), and a hold ended by its key's revocation or its organization's
suspension, having claimed nothing since (api/runners.py, runs/waits/runners.py)."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from django.db import transaction

from api.runners import polls_held
from billing import quotas
from billing.models import ApiKey
from billing.selectors import KEY_REVOKED, ORGANIZATION_SUSPENDED
from billing.services import api_key_revoke
from runs.models import Runner, RunnerJob
from runs.people import suspension
from runs.waits import runners
from tests import factories
from tests.api import states
from tests.support import wait_until
from tests.tenants import LiveTenant

pytestmark = pytest.mark.django_db(transaction=True)


@dataclass(frozen=True)
class Live(LiveTenant):
    runner: Runner

    def poll(self, wait: int) -> httpx.Response:
        return httpx.get(
            f"{self.url}/api/v1/runner/jobs",
            params={"runner_id": self.runner.pk, "wait": wait},
            headers=self.auth,
            timeout=60,
        )


@pytest.fixture
def live(live_server: Any) -> Live:
    organization, key = factories.org_with_key()
    return Live(live_server.url, key, organization, states.runner(organization))


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(max_workers=4) as executor:
        yield executor


def held(live: Live, pool: ThreadPoolExecutor) -> Future[httpx.Response]:
    """A poll of 30 s, once the server holds it."""
    before = polls_held(live.organization.pk)
    polling = pool.submit(live.poll, 30)
    wait_until(
        lambda: polls_held(live.organization.pk) > before or polling.done(),
        what="the poll to be held",
    )
    assert not polling.done(), polling.result().text
    return polling


def test_a_poll_held_past_the_quota_is_429_too_many_polls_and_an_ended_hold_frees_its_place(
    live: Live, pool: ThreadPoolExecutor
) -> None:
    quotas.quotas_set(live.organization.pk, actor="test", runner_polls=1)
    first = held(live, pool)

    refused = live.poll(5)
    not_held = live.poll(0)  # a poll that does not wait holds nothing: never refused
    job = states.runner_job(live.organization)  # wakes the held poll, which claims it

    assert (refused.status_code, refused.headers.get("Retry-After")) == (429, "5")
    assert refused.json() == {
        "code": "too_many_polls",
        "message": "the organization has 1 runner polls held, its quota; poll again in 5 s, "
        "or ask an operator to raise the quota",
        "details": {"quota": "runner_polls", "limit": 1, "retry_after": 5},
    }
    assert not_held.status_code == 204
    answered = first.result()
    assert (answered.status_code, answered.json()["job"]["id"]) == (200, str(job.pk))
    wait_until(lambda: polls_held(live.organization.pk) == 0, what="the hold's release")
    again = held(live, pool)  # its place is free
    states.runner_job(live.organization)
    assert again.result().status_code == 200


def test_a_held_poll_woken_by_two_jobs_claims_one_and_leaves_the_other_pending(
    live: Live, pool: ThreadPoolExecutor
) -> None:
    """A poll without `max_jobs` answers one job: its later looks claim one too, not as
    many as the organization's held places (the other would have been claimed and never
    handed over, its step waiting out its timeout)."""
    polling = held(live, pool)
    with transaction.atomic():  # one wake-up, both jobs pending at the look it starts
        jobs = {states.runner_job(live.organization).pk for _ in range(2)}

    answered = polling.result()

    assert answered.status_code == 200
    assert answered.json()["job"]["id"] in {str(pk) for pk in jobs}
    statuses = sorted(RunnerJob.objects.filter(pk__in=jobs).values_list("status", flat=True))
    assert statuses == ["claimed", "pending"]


def test_a_held_poll_ends_with_its_keys_revocation_and_claims_nothing_after(
    live: Live, pool: ThreadPoolExecutor
) -> None:
    polling = held(live, pool)

    api_key_revoke(api_key=ApiKey.objects.get(organization=live.organization))
    job = states.runner_job(live.organization)  # a job, and a wake-up, after it

    answered = polling.result()
    assert answered.status_code == 401
    assert RunnerJob.objects.get(pk=job.pk).status == "pending"
    wait_until(lambda: polls_held(live.organization.pk) == 0, what="the hold's release")


def test_a_held_poll_ends_with_its_organizations_suspension(
    live: Live, pool: ThreadPoolExecutor
) -> None:
    """The suspension wakes the organization's held polls: each looks, and ends."""
    polling = held(live, pool)

    suspension.organization_suspend(organization=live.organization, reason="test")

    answered = polling.result()
    assert (answered.status_code, answered.json()["code"]) == (403, "organization_suspended")
    wait_until(lambda: polls_held(live.organization.pk) == 0, what="the hold's release")


def test_a_look_after_the_revocation_claims_nothing(live: Live) -> None:
    """The service's own check, under the request's authentication: the look that
    would claim reads the key again."""
    job = states.runner_job(live.organization)
    api_key = ApiKey.objects.get(organization=live.organization)
    api_key_revoke(api_key=api_key)

    looked = runners.poll(
        organization=live.organization, runner_id=live.runner.pk, api_key_id=api_key.pk
    )

    assert (looked.refused, looked.job, looked.empty) == (KEY_REVOKED, None, False)
    assert RunnerJob.objects.get(pk=job.pk).status == "pending"


def test_a_look_for_a_suspended_organization_claims_nothing(live: Live) -> None:
    job = states.runner_job(live.organization)
    api_key = ApiKey.objects.get(organization=live.organization)
    suspension.organization_suspend(organization=live.organization)

    looked = runners.poll(
        organization=live.organization, runner_id=live.runner.pk, api_key_id=api_key.pk
    )

    assert (looked.refused, looked.job) == (ORGANIZATION_SUSPENDED, None)
    assert RunnerJob.objects.get(pk=job.pk).status == "pending"


def test_the_organization_shows_its_held_polls(
    live: Live, pool: ThreadPoolExecutor, settings: Any
) -> None:
    polling = held(live, pool)
    shown = httpx.get(
        f"{live.url}/api/v1/organization",
        headers={"Authorization": f"Bearer {live.key}"},
        timeout=10,
    ).json()["quotas"]["runner_polls"]
    states.runner_job(live.organization)  # ends the hold

    assert polling.result().status_code == 200
    assert shown == {"limit": settings.QUOTA_RUNNER_POLLS, "used": 1}
