"""The pure rules of run webhooks: the retry schedule, what a URL and events may be."""

from __future__ import annotations

import pytest

from webhooks.services import events_problem, retry_delay, url_problem


def test_retries_double_from_the_base_up_to_the_cap() -> None:
    delays = [retry_delay(n, base=5, cap=3 * 3600, jitter=0.5) for n in range(1, 15)]
    assert delays[:6] == [5, 10, 20, 40, 80, 160]
    assert delays[-1] == 3 * 3600
    assert delays == sorted(delays)


def test_jitter_spreads_a_delay_from_three_quarters_to_five_quarters() -> None:
    assert retry_delay(3, base=5, cap=100, jitter=0.0) == 15
    assert retry_delay(3, base=5, cap=100, jitter=0.999999) == pytest.approx(25, abs=1e-3)


def test_the_first_retries_come_within_two_minutes_whatever_the_jitter() -> None:
    worst = sum(retry_delay(n, base=5, cap=3 * 3600, jitter=0.999999) for n in range(1, 5))
    assert worst < 120


def test_the_default_schedule_keeps_retrying_for_a_day_without_overflowing() -> None:
    elapsed, attempts = 0.0, 0
    while elapsed < 24 * 3600:
        attempts += 1
        elapsed += retry_delay(attempts, base=5, cap=3 * 3600, jitter=0.5)
    assert 15 <= attempts <= 25
    assert retry_delay(10_000, base=5, cap=3 * 3600, jitter=0.5) == 3 * 3600


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("https://hooks.example.com/x", None),
        ("http://10.0.0.1:8080/hook?a=1", None),
        ("ftp://example.com/", "must be an http or https URL"),
        ("example.com/hook", "must be an http or https URL"),
        ("https:///path", "must name a host"),
        (
            "https://user:pw@example.com/",
            "must not hold credentials (sign with the secret instead)",
        ),
        ("https://example.com:99999/", "not a valid URL"),
        ("https://exa mple.com/", "must not contain white space"),
    ],
)
def test_a_url_is_http_or_https_with_a_host_and_is_not_resolved(
    url: str, problem: str | None
) -> None:
    assert url_problem(url) == problem


def test_events_are_known_types_and_at_least_one() -> None:
    assert events_problem(["run.completed", "escalation.opened"]) is None
    assert events_problem([]) == "at least one event type"
    assert "unknown event type 'run.started'" in str(events_problem(["run.started"]))
