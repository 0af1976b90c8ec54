"""Rate limits shared by the fleet, on a real worker (two prefork processes): in ANY
window of the period at most the limit is granted, every step completes, keyed buckets
are independent, a limit changed while steps wait applies to them, and a cancelled or
paused run's waiting steps give their places back (docs/rate-limits.md)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest

from billing.models import Organization
from ratelimits.models import RateGrant
from runs import services
from runs.admission import step_admission
from runs.models import Run, Step
from tests import factories
from tests.integration.engine_support import assert_books_balanced, submit, wait_for
from tests.support import wait_until
from web.prometheus import OrchestratorCollector

pytestmark = [
    pytest.mark.integration,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("celery_worker"),
]


def limited(width: int, uses: list[dict[str, Any]], name: str = "limited") -> dict[str, Any]:
    """``width`` steps at once, each using the rate limits ``uses``."""
    return factories.fan(width, name, join=False, rate_limits=uses) | {
        "variables": {"customer": "acme"}
    }


def most_in_any_window(times: list[datetime], period: timedelta) -> int:
    """The most grants in any window [t, t + period): the worst windows start at a grant."""
    times = sorted(times)
    most, end = 0, 0
    for start in range(len(times)):
        while end < len(times) and times[end] < times[start] + period:
            end += 1
        most = max(most, end - start)
    return most


def grants(bucket_prefix: str) -> list[datetime]:
    return list(
        RateGrant.objects.filter(bucket__startswith=bucket_prefix, used=True).values_list(
            "granted_at", flat=True
        )
    )


def limit(organization: Organization, name: str, most: int, period_ms: int) -> None:
    step_admission.rate_limit_put(
        organization=organization, name=name, limit=most, period_ms=period_ms
    )


def test_three_hundred_steps_under_fifty_per_five_seconds_never_exceed_it_and_all_complete() -> (
    None
):
    organization = factories.org(credits=10_000)
    limit(organization, "openai", 50, 5000)
    run = submit(limited(300, [{"name": "openai"}]), organization=organization)

    done = wait_for(run, timeout=120)

    assert done.status == "completed", done.last_error
    times = grants(f"o:{organization.pk}:openai:")
    # Every step was granted its units. A step claimed more than RATE_LIMIT_LATE_S after
    # its moment (a worker slower than that, as on a loaded machine) asked again, and its
    # first grant stays spent: more grants than steps then, never fewer, and the window
    # holds over all of them.
    granted_steps = set(
        RateGrant.objects.filter(run_id=run.pk, used=True).values_list("step_id", flat=True)
    )
    assert granted_steps == set(Step.objects.filter(run=run).values_list("pk", flat=True))
    assert len(times) >= 300
    worst = most_in_any_window(times, timedelta(seconds=5))
    print(
        f"{len(times)} grants over {(max(times) - min(times)).total_seconds():.1f} s; "
        f"worst window {worst}"
    )
    assert worst <= 50
    # It waited (the limit did hold it back) and waits for nothing now.
    assert (max(times) - min(times)).total_seconds() >= 25
    assert not Step.objects.filter(run=run).exclude(waiting_reason="").exists()
    assert set(Step.objects.filter(run=run).values_list("attempts", flat=True)) == {1}
    assert_books_balanced(run)

    # /metrics counts what was granted and how often steps waited, by limit.
    def counted() -> dict[str, float] | None:
        found = {
            sample.name: sample.value
            for family in OrchestratorCollector().collect()
            for sample in family.samples
            if sample.labels.get("limit") == "openai"
        }
        granted = found.get("orchestrator_rate_limit_units_granted_total", 0)
        return found if granted >= 300 else None

    figures = wait_until(counted, timeout=30, what="the workers' rate limit figures")
    assert figures["orchestrator_rate_limit_waits_total"] >= 1
    assert figures["orchestrator_rate_limit_wait_seconds_count"] >= 1


def test_keyed_buckets_are_independent_and_a_limit_changed_while_steps_wait_applies() -> None:
    organization = factories.org(credits=10_000)
    limit(organization, "per-customer", 2, 60_000)
    acme = submit(
        limited(4, [{"name": "per-customer", "key": "${variables.customer}"}], name="acme"),
        organization=organization,
    )
    globex_plan = limited(2, [{"name": "per-customer", "key": "globex"}], name="globex")
    globex = submit(globex_plan, organization=organization)

    # globex's bucket is its own: both of its steps run while acme's last two wait.
    assert wait_for(globex, timeout=60).status == "completed"

    def two_waiting() -> bool:
        reasons = Step.objects.filter(run=acme, waiting_reason="rate_limited:per-customer")
        return reasons.count() == 2

    wait_until(two_waiting, timeout=30, what="acme's last two steps to wait a minute")
    waiting = Step.objects.get(run=acme, status="pending", waiting_reason__gt="", name="s3")
    assert waiting.next_run_at is not None
    assert waiting.attempts == 0  # the attempt it was claimed for was given back

    # Raised while they wait: they run now, not a minute from now.
    limit(organization, "per-customer", 10, 60_000)
    assert wait_for(acme, timeout=30).status == "completed"
    assert len(grants(f"o:{organization.pk}:per-customer:acme")) == 4
    assert len(grants(f"o:{organization.pk}:per-customer:globex")) == 2


def test_a_cancelled_run_gives_its_places_back_and_a_paused_one_asks_again() -> None:
    organization = factories.org(credits=10_000)
    limit(organization, "slow", 1, 60_000)
    first = submit(limited(3, [{"name": "slow"}], name="first"), organization=organization)
    wait_until(
        lambda: Step.objects.filter(run=first).exclude(waiting_reason="").count() == 2,
        timeout=30,
        what="two of the first run's steps to wait",
    )
    second = submit(limited(1, [{"name": "slow"}], name="second"), organization=organization)
    wait_until(
        lambda: Step.objects.filter(run=second).exclude(waiting_reason="").count() == 1,
        timeout=30,
        what="the second run's step to wait behind them",
    )
    behind = Step.objects.get(run=second)
    assert behind.next_run_at is not None

    services.run_cancel(run_id=first.pk, reason="not needed")

    # Its reservations are gone; the second run's step moved up to the first free place.
    assert not RateGrant.objects.filter(run_id=first.pk, used=False).exists()
    moved = Step.objects.get(run=second)
    assert moved.next_run_at is not None
    assert moved.next_run_at < behind.next_run_at
    assert not Step.objects.filter(run=first).exclude(waiting_reason="").exists()

    # Paused while it waits: it waits for nothing; resumed, it asks again, and runs once
    # the limit lets it (raised here so that the test need not wait a minute).
    services.run_pause(run_id=second.pk)
    paused = Step.objects.get(run=second)
    assert paused.status == "paused"
    assert paused.waiting_reason == ""
    assert not RateGrant.objects.filter(run_id=second.pk, used=False).exists()
    limit(organization, "slow", 5, 60_000)
    services.run_resume(run_id=second.pk)
    assert wait_for(second, timeout=30).status == "completed"
    assert Run.objects.get(pk=first.pk).status == "cancelled"


def test_steps_in_a_limits_line_start_when_their_units_come_and_count_the_wait_apart() -> None:
    organization = factories.org(credits=1000)
    limit(organization, "timed", 2, 1000)
    run = submit(limited(8, [{"name": "timed"}], name="timed"), organization=organization)

    done = wait_for(run, timeout=60)

    assert done.status == "completed"
    steps = list(Step.objects.filter(run=run))
    starts = sorted(step.started_at for step in steps if step.started_at is not None)
    assert len(starts) == 8
    # 2 units a second for 8 steps: their calls, and so their starts, spread over 3 s and
    # more, not over the moment they were first claimed.
    assert starts[-1] - starts[0] >= timedelta(seconds=2.5)
    waited = [step for step in steps if step.waited_ms > 0]
    assert len(waited) >= 6  # all but the first window's two
    for step in waited:
        assert step.duration_ms is not None
        assert step.duration_ms < step.waited_ms  # the wait is not counted as work
    assert_books_balanced(done)
