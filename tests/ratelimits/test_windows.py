"""The sliding window (ratelimits.windows), against PostgreSQL: whatever the asks, every
window of the period holds at most the limit; the line is first come, first served; a
step that spends two limits waits for the later of the two."""

from __future__ import annotations

import random
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from ratelimits.models import RateGrant
from ratelimits.windows import Ask, Asker, earliest, reserve

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def ask(units: int = 1, limit: int = 3, period_ms: int = 1000, bucket: str = "b") -> Ask:
    return Ask(bucket, uuid.uuid4(), bucket, limit, period_ms, units)


def asker(step: int) -> Asker:
    return Asker(step, None, 5, T0)


def seconds(at: datetime) -> float:
    return (at - T0).total_seconds()


def heaviest_window(bucket: str, period: timedelta) -> int:
    """The most units in any window [t, t + period): the heaviest starts at a grant."""
    rows = sorted(RateGrant.objects.filter(bucket=bucket).values_list("granted_at", "units"))
    return max(
        sum(units for at, units in rows if start <= at < start + period) for start, _ in rows
    )


def test_the_limit_is_granted_at_once_then_each_unit_as_the_oldest_leaves_the_window() -> None:
    moments = [seconds(reserve([ask()], asker(n), T0, used=True)[0]) for n in range(7)]

    # Three at once; the fourth when the first leaves its window (1 s later), and so on:
    # never a fourth unit inside any second.
    assert moments == [0, 0, 0, 1, 1, 1, 2]


def test_an_ask_never_goes_before_one_already_waiting() -> None:
    reserve([ask(units=3)], asker(1), T0, used=True)
    waiting = reserve([ask(units=2)], asker(2), T0, used=False)[0]
    # One unit would fit nowhere sooner either: it lines up behind the waiting step.
    later = reserve([ask(units=1)], asker(3), T0 + timedelta(milliseconds=10), used=False)[0]

    assert seconds(waiting) == 1
    assert later >= waiting


def test_a_step_spending_two_limits_waits_for_the_later_and_holds_both_at_that_moment() -> None:
    reserve([ask(units=3, bucket="a")], asker(1), T0, used=True)
    reserve([ask(units=2, limit=2, period_ms=5000, bucket="b")], asker(2), T0, used=True)

    at, binding = reserve(
        [ask(bucket="a"), ask(limit=2, period_ms=5000, bucket="b")], asker(3), T0, used=False
    )

    assert seconds(at) == 5
    assert binding.bucket == "b"
    assert set(RateGrant.objects.filter(step_id=3).values_list("bucket", "granted_at")) == {
        ("a", at),
        ("b", at),
    }


@pytest.mark.parametrize("seed", range(5))
def test_any_sequence_of_asks_keeps_every_window_within_the_limit(seed: int) -> None:
    rand = random.Random(seed)
    limit, period = rand.randint(1, 20), timedelta(milliseconds=rand.choice([50, 1000, 5000]))
    now = T0
    for step in range(150):
        now += timedelta(milliseconds=rand.choice([0, 0, 1, 7, 40, 300]))
        units = rand.randint(1, limit)
        reserve([ask(units, limit, int(period / timedelta(milliseconds=1)))], asker(step), now,
                used=rand.random() < 0.5)  # fmt: skip

    assert heaviest_window("b", period) <= limit
    assert RateGrant.objects.filter(bucket="b").count() == 150


def test_earliest_is_the_moment_reserve_grants() -> None:
    for n in range(5):
        reserve([ask(units=2, limit=4)], asker(n), T0 + timedelta(milliseconds=100 * n), used=True)
    expected = earliest(ask(units=3, limit=4), T0 + timedelta(milliseconds=450))

    assert (
        reserve([ask(units=3, limit=4)], asker(9), T0 + timedelta(milliseconds=450), used=False)[0]
        == expected
    )
